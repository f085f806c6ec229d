"""What a stage probe costs: per call when nobody listens, when a Recorder listens, and on a layer.

    python experiments/probe_overhead.py                 # about 15 s on 2 idle cores
    python experiments/probe_overhead.py --calls 20000 --repeat 3

The runtime wraps each stage of a plan in ``with stage(name) as s:`` (:mod:`ngra.probes`).
Without an active Recorder that must cost about as much as the with-block itself; this
measures it against the same with-block on the shared do-nothing object entered directly
(no ``stage()`` call), then with a Recorder active, then a GCN layer call (Cora-sized
random graph, generic and compiled plans) with and without a Recorder, in interleaved
rounds. Per-call figures are the median over ``--repeat`` timed loops (``--calls`` calls
each for a stage, ``--calls / 2500`` for the layer). The tests check only what holds
without a clock (``tests/ngra/test_probes.py``: no clock read, nothing kept); the timing
lives here.

Writes ``experiments/results/probe_overhead.{md,csv}``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import _bench_util as bu

RESULTS = Path(__file__).resolve().parent / "results"


def _per_call(body, calls: int, repeat: int) -> float:
    def loop() -> None:
        for _ in range(calls):
            body()

    return bu.time_fn(loop, warmup=1, repeat=repeat).median / calls


def _fmt(s: float) -> str:
    return f"{s * 1e9:.0f} ns" if s < 1e-5 else bu.fmt_seconds(s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS / "probe_overhead")
    args = ap.parse_args(argv)
    bu.pin_environment(args.threads, thp=False)

    import torch

    import ngra
    from ngra.compiler import disabled
    from ngra.models import GCNConv
    from ngra.probes import Recorder, stage

    from ngra.probes import _NULL

    def bare_with() -> None:
        with _NULL as s:
            s.outputs(None)

    def probe() -> None:
        with stage("edge") as s:
            s.outputs(None)

    rows = [{"what": "with-block on the no-op object, no stage() call",
             "per_call_s": _per_call(bare_with, args.calls, args.repeat)},
            {"what": "stage, no Recorder", "per_call_s": _per_call(probe, args.calls, args.repeat)}]
    with Recorder():
        rows.append({"what": "stage, Recorder active",
                     "per_call_s": _per_call(probe, args.calls, args.repeat)})

    gen = torch.Generator().manual_seed(0)
    n = 2708
    ei = torch.randint(0, n, (2, 10_556), generator=gen)
    g = ngra.Graph.from_edge_index(ei, num_nodes=n).gcn_norm()
    layer = GCNConv(64, 16)
    x = torch.randn(n, 64, generator=gen)
    layer_calls = max(args.calls // 2500, 10)
    for plan, ctx in (("generic", disabled), ("compiled", contextlib.nullcontext)):
        bare, rec = [], []
        with ctx(), torch.no_grad():
            for _ in range(args.repeat):  # interleaved, so the machine's load touches both
                bare.append(_per_call(lambda: layer(g, x), layer_calls, 1))
                with Recorder():
                    rec.append(_per_call(lambda: layer(g, x), layer_calls, 1))
        bare_s, rec_s = statistics.median(bare), statistics.median(rec)
        rows.append({"what": f"GCNConv {plan} plan, no Recorder", "per_call_s": bare_s})
        rows.append({"what": f"GCNConv {plan} plan, Recorder active", "per_call_s": rec_s,
                     "vs_no_recorder": statistics.median(r / b for r, b in zip(rec, bare))})
    base = rows[0]["per_call_s"]
    for r in rows[:3]:
        r["vs_no_recorder"] = r["per_call_s"] / base  # the stage rows: against the bare with

    table = bu.markdown_table(
        [{**r, "t": _fmt(r["per_call_s"]),
          "ratio": None if "vs_no_recorder" not in r else bu.fmt_ratio(r["vs_no_recorder"])}
         for r in rows],
        [("what", "what"), ("t", "per call"), ("ratio", "ratio")])
    info = bu.machine_info()
    text = "\n".join([
        "# Stage probe overhead",
        "",
        f"Regenerate: `python experiments/probe_overhead.py --calls {args.calls} "
        f"--repeat {args.repeat} --threads {args.threads}`",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()),
        "",
        "Median per call over the timed loops. Ratio: the three stage rows against the bare "
        "with-block; each Recorder-active layer row against the same plan without a Recorder "
        "(median of the per-round ratios). "
        "Cora-sized random graph (2,708 vertices, 10,556 edges), 64 -> 16 features, no grad.",
        "",
        table,
        "",
    ])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    bu.write_csv(rows, args.out.with_suffix(".csv"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
