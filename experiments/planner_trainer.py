"""The planner's GNN plans run by the graph trainer itself: predicted vs measured.

``planner_validation.py`` checks the ranking on stand-in modules of each chain's shapes;
this runs the real thing: for each zoo model, ``ngra plan --devices K`` ranks its plans,
and ``ngra train --nprocs K --plan FILE`` trains each of them (data- and tensor-parallel
plans run in the trainer, :mod:`ngra.distributed.dense`) for ``--epochs`` epochs, one
thread a rank; the median epoch (slowest rank; it includes the evaluation forward, which the
prediction of a training step does not) is set beside the predicted step time. Plans are
run in interleaved rounds (A, B, C, then A, B, C) so that the machine's load touches all.

    python experiments/planner_trainer.py                # gcn, ggcn on Cora, 4 processes
    python experiments/planner_trainer.py --models gat --devices 2 --rounds 1

Writes ``experiments/results/planner_trainer.{md,csv}``: per plan the predicted and measured
times, and per model Kendall tau and the regret of the top pick.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _bench_util as bu

RESULTS = Path(__file__).resolve().parent / "results"


def _ngra(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "ngra", *args], capture_output=True, text=True,
                       timeout=1800, check=False)
    if r.returncode:
        raise SystemExit(f"ngra {' '.join(args)} failed:\n{r.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    from ngra.planner.measure import kendall_tau

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gcn,ggcn")
    ap.add_argument("--dataset", default="cora")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "planner_trainer")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ngra-planner-trainer-"))
    rows, lines = [], []
    for model in args.models.split(","):
        plans_file = tmp / f"{model}.json"
        _ngra("plan", "--model", model, "--dataset", args.dataset, "--devices",
              str(args.devices), "--out", str(plans_file))
        plans = json.loads(plans_file.read_text())["plans"]
        times: list[list[float]] = [[] for _ in plans]
        for rnd in range(args.rounds):
            for i, plan in enumerate(plans):
                one = tmp / f"{model}-{i}.json"
                one.write_text(json.dumps({"plans": [plan]}))
                out = tmp / f"{model}-{i}-{rnd}.out.json"
                _ngra("train", "--model", model, "--dataset", args.dataset, "--nprocs",
                      str(args.devices), "--threads", "1", "--epochs", str(args.epochs),
                      "--no-progress", "--plan", str(one), "--out", str(out))
                summary = json.loads(out.read_text())
                times[i].append(max(summary["epoch_time_s_per_rank"]))
                print(f"{model} {plan['label']}: round {rnd}: "
                      f"{times[i][-1] * 1e3:.1f} ms", flush=True)
        pred = [p["predicted_time_s"] for p in plans]
        meas = [statistics.median(t) for t in times]
        for p, m in zip(plans, meas):
            rows.append({"model": model, "dataset": args.dataset, "devices": args.devices,
                         "plan": p["label"], "predicted_s": p["predicted_time_s"],
                         "measured_s": m})
        tau = kendall_tau(pred, meas) if len(plans) > 1 else float("nan")
        regret = meas[0] / min(meas) - 1
        lines.append(f"- {model}: Kendall tau: {tau:.2f}; regret: {regret * 100:.1f}% "
                     f"({len(plans)} plans; top pick {plans[0]['label']}, measured best "
                     f"{plans[meas.index(min(meas))]['label']})")
    table = bu.markdown_table(
        [{**r, "pred": bu.fmt_seconds(r["predicted_s"]), "meas": bu.fmt_seconds(r["measured_s"])}
         for r in rows],
        [("model", "model"), ("plan", "plan"), ("pred", "predicted step"),
         ("meas", "measured epoch")])
    info = bu.machine_info()
    text = "\n".join([
        "# The planner's GNN plans run by the graph trainer",
        "",
        f"Regenerate: `python experiments/planner_trainer.py --models {args.models} "
        f"--dataset {args.dataset} --devices {args.devices} --epochs {args.epochs} "
        f"--rounds {args.rounds}`",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()),
        "",
        f"{args.devices} gloo processes, one thread each; the measured epoch is the median "
        "over the rounds of the slowest rank's median epoch (training step plus the "
        "evaluation forward); the prediction is the planner's training step.",
        "",
        table,
        "",
        *lines,
        "",
    ])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    bu.write_csv(rows, args.out.with_suffix(".csv"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
