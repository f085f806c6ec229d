"""``ngra characterize``: argparse glue; each flag maps to one CharacterizeConfig field."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from ngra.datasets import available

__all__ = ["add_parser", "run"]


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _datasets(text: str) -> list[str]:
    """Dataset specs separated by ``;``, or by commas between spec names.

    ``cora,citeseer,rmat:scale=18,edge_factor=16`` splits into ``cora``,
    ``citeseer`` and ``rmat:scale=18,edge_factor=16``: a comma starts a new
    spec unless the token is a ``key=value`` of the spec before it.
    """
    if ";" in text:
        return [t.strip() for t in text.split(";") if t.strip()]
    out: list[str] = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        continues = out and ":" in out[-1] and ":" not in tok
        if continues and ("=" in tok or _is_flag(tok)):
            out[-1] += "," + tok
        else:
            out.append(tok)
    return out


def _is_flag(tok: str) -> bool:
    """A bare word after a spec is one of its flags unless it names a dataset."""

    return tok.lower() not in available()


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "characterize", help="per-stage time, FLOPs, bytes and memory in ngra, PyG and DGL",
        description="Run models x datasets x frameworks, time each SAGA stage (Scatter, "
                    "ApplyEdge, Gather, ApplyVertex), and write runs.csv, report.md, "
                    "stages.png and roofline.png to --out.")
    p.add_argument("--models", type=_csv, default="gcn,gat,sage,gin,ggnn,rgcn",
                   help="comma-separated zoo models (default: gcn,gat,sage,gin,ggnn,rgcn)")
    p.add_argument("--datasets", type=_datasets, default="cora",
                   help="dataset specs, e.g. cora,citeseer,rmat:scale=18,edge_factor=16 "
                        "(or separated by ';') (default: cora)")
    p.add_argument("--frameworks", type=_csv, default="ngra,pyg,dgl",
                   help="ngra, ngra-generic (compiler disabled), pyg, dgl (default: ngra,pyg,dgl)")
    p.add_argument("--mode", dest="modes", type=_csv, default="inference",
                   help="inference, training, or both comma-separated (default: inference)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--repeats", type=int, default=5, help="timed iterations per run (default: 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default: 2)")
    p.add_argument("--hidden", type=int, default=64,
                   help="hidden width; GAT: total over 8 heads (default: 64)")
    p.add_argument("--data-root", default=None, help="dataset folder (default: $NGRA_DATA)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--timeout", dest="timeout_s", type=float, default=600.0,
                   help="seconds a run may take before it is killed and recorded as skipped "
                        "(repeats shrink to fit half of it) (default: 600)")
    p.add_argument("--memory-cap-gb", type=float, default=8.0,
                   help="memory a run may allocate; beyond it the run is recorded as skipped; "
                        "0 = no cap (default: 8)")
    p.add_argument("--no-isolate", dest="isolate", action="store_false",
                   help="run in this process (no time or memory caps)")
    p.add_argument("--reuse-ceilings", dest="remeasure_ceilings", action="store_false",
                   help="reuse DIR/ceilings.json instead of measuring again")
    p.add_argument("--no-plain", dest="plain", action="store_false",
                   help="skip the uninstrumented iterations (saves time on large graphs)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run each dataset's framework groups this many times, frameworks taking "
                        "turns, and report each run's median round (default: 1)")
    p.add_argument("--append", action="store_true",
                   help="keep DIR/runs.csv rows of runs not repeated here (grids in pieces)")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild report.md and the plots from DIR/runs.csv; run nothing")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def run(args: argparse.Namespace) -> int:
    """Run (or rebuild) and print the outputs, then the runs that did not complete.

    Without a completed run :class:`~ngra.characterize.NoCompletedRunsError` (a
    ``ValueError``) propagates: ``ngra``'s ``main`` prints it and exits with status 2.
    """
    from ngra.characterize import CharacterizeConfig, characterize, rebuild_outputs
    from ngra.characterize.report import read_csv, unfinished

    if args.report_only:
        paths = rebuild_outputs(args.out)
    else:
        names = {f.name for f in fields(CharacterizeConfig)}
        kw = {k: v for k, v in vars(args).items() if k in names}
        if not kw.get("memory_cap_gb"):
            kw["memory_cap_gb"] = None
        paths = characterize(CharacterizeConfig(**kw))
    for name, path in paths.items():
        print(f"{name}: {path}")
    rows = read_csv(paths["runs.csv"])
    lines = unfinished(rows)
    if lines:
        n = sum(1 for r in rows if r["status"] != "ok")
        runs = len({(r["framework"], r["model"], r["dataset"], r["mode"]) for r in rows})
        print(f"ngra characterize: {n} of {runs} runs did not complete (listed in "
              f"{paths['report.md']}):\n  " + "\n  ".join(lines), file=sys.stderr)
    return 0
