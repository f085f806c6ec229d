"""``ngra plan``: argparse glue for the planner (see README "Plan the dense layers")."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any
from ngra.diskspace import write_file
from ngra.models import MODELS
from ngra.partition import parse_bytes

__all__ = ["add_parser", "model_chain", "run"]

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="rank data / tensor / pipeline parallel plans of a model's dense layers",
        description="Trace a model's dense layers (a zoo GNN's compiled vertex-side stages, an "
                    "MLP, or any nn.Module), search data / tensor / pipeline parallel plans for "
                    "--devices devices with the calibrated link model, print them ranked and "
                    "write them as JSON (a `plans` list, fastest first).")
    p.add_argument("--model", default=None,
                   help=f"a zoo GNN ({', '.join(sorted(MODELS))}), or mlp:W0,W1,...,Wn (an MLP "
                        "stack of Linear+ReLU of those widths)")
    p.add_argument("--module", default=None, metavar="PKG.MOD:FACTORY",
                   help="plan any nn.Module: FACTORY() builds it (traced with torch.fx)")
    p.add_argument("--dataset", default="sbm", help="dataset spec for a GNN (default: sbm)")
    p.add_argument("--partition", default=None, metavar="DIR",
                   help="a GNN's partition book (`ngra partition --out DIR`): its halo rows "
                        "price the graph exchange of data parallel over its parts (default: "
                        "the book `ngra train --nprocs` caches beside the dataset, built if "
                        "missing)")
    p.add_argument("--partition-method", default="metis", choices=("metis", "range"),
                   help="how books that are not given are built (default: metis, as ngra "
                        "train)")
    p.add_argument("--rows", type=int, default=8192,
                   help="global batch rows of an MLP / --module (default: 8192)")
    p.add_argument("--devices", type=int, default=None, help="devices (ranks) to plan for")
    p.add_argument("--memory", default=None, metavar="SIZE",
                   help="memory per device, e.g. 8GB (default: this machine's RAM / devices)")
    p.add_argument("--micro-batches", default="1,2,4,8",
                   help="micro-batch counts to consider (default: 1,2,4,8)")
    p.add_argument("--no-recompute", dest="recompute", action="store_false",
                   help="never recompute activations")
    p.add_argument("--hidden", type=int, default=None, help="GNN hidden width (default: per model)")
    p.add_argument("--heads", type=int, default=None, help="GAT heads")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--data-root", default=None, help="dataset folder")
    p.add_argument("--top", type=int, default=10, help="plans to print (default: 10)")
    p.add_argument("--out", default=None, help="write the ranked plans here (JSON)")
    p.add_argument("--calibrate", action="store_true",
                   help="measure the link and compute rates of --devices ranks now (cached "
                        "per machine in $NGRA_CALIBRATION or ~/.ngra/calibration)")


def _mlp(spec: str) -> Any:
    from torch import nn

    try:
        widths = [int(w) for w in spec.split(":", 1)[1].split(",")]
    except ValueError:
        widths = []
    if len(widths) < 2 or min(widths) < 1:
        raise ValueError(f"--model {spec!r}: expected mlp:W0,W1,... with at least two widths "
                         ">= 1, e.g. mlp:256,4096,4096,256.")
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if k < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _factory(spec: str) -> Any:
    import importlib

    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise ValueError(f"--module {spec!r}: expected PKG.MOD:FACTORY.")
    try:
        return getattr(importlib.import_module(mod), attr)()
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--module {spec!r}: {exc}") from None


def model_chain(args: argparse.Namespace) -> Any:
    """The chain ``args`` names: a zoo GNN on a dataset, an MLP or a module factory."""
    from ngra.planner.trace import trace_module

    if (args.model is None) == (args.module is None):
        raise ValueError("give one of --model (a zoo GNN or mlp:W0,W1,...) or --module.")
    if args.rows < 1:
        raise ValueError(f"--rows must be >= 1; got {args.rows}.")
    if args.module:
        return trace_module(_factory(args.module), args.rows, name=args.module)
    if args.model.startswith("mlp:"):
        return trace_module(_mlp(args.model), args.rows, name=args.model)
    from ngra.planner.train_plans import zoo_chain

    return zoo_chain(args.model, args.dataset, args.devices or 1, hidden=args.hidden,
                     heads=args.heads, num_layers=args.num_layers, data_root=args.data_root,
                     partition=args.partition, method=args.partition_method)


def run(args: argparse.Namespace) -> int:
    from ngra.planner import Devices, format_table, search
    from ngra.planner.train_plans import default_memory, device_link

    k = args.devices
    if k is None or isinstance(k, bool) or k < 1:
        raise ValueError(f"--devices must be an int >= 1; got {k}.")
    if args.calibrate:
        link = device_link(k, refresh=True)
        print(link.describe())
        if args.model is None and args.module is None:
            return 0
    chain = model_chain(args)
    if not args.calibrate:
        link = device_link(k)
    memory = parse_bytes(args.memory) if args.memory else default_memory(k)
    try:
        micro = [int(m) for m in args.micro_batches.split(",") if m.strip()]
    except ValueError:
        raise ValueError(f"--micro-batches {args.micro_batches!r}: expected counts such as "
                         "1,2,4,8.") from None
    devices = Devices(k, memory, link)
    recompute = (False, True) if args.recompute else (False,)
    plans = search(chain, devices, micro, recompute)
    print(f"ngra plan: {chain.name}: {len(chain)} layers, {chain.rows} rows, "
          f"{chain.param_bytes / 2**20:.1f} MiB of parameters; {k} device(s) of "
          f"{memory / 2**30:.1f} GiB")
    print(link.describe())
    if chain.halo:
        print("graph exchange: halo rows of the busiest rank (partition book), "
              + ", ".join(f"{p}-way {r:,}" for p, r in chain.halo))
    print(format_table(plans, args.top))
    if args.out:
        record = {"command": "ngra " + " ".join(sys.argv[1:]), "chain": chain.to_json(),
                  "devices": k, "memory_per_device_bytes": memory,
                  "link": link.describe(), "plans": [p.to_json() for p in plans]}
        path = Path(args.out)
        write_file(path, json.dumps(record, indent=1) + "\n", "the plans")
        print(f"{len(plans)} plans written to {path}")
    return 0
