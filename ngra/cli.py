"""The ``ngra`` command line: ``ngra train``, ``ngra predict``, ``ngra partition``,
``ngra explain``, ``ngra characterize``, ``ngra plan``, ``ngra info``.

A thin layer over the library: every ``train`` flag maps to one
:class:`ngra.training.TrainConfig` field (what :func:`ngra.fit` takes by name), and
``predict`` is :func:`ngra.load_model` and :meth:`~ngra.training.Predictor.predict`.
Flags are never abbreviated (``--epoch`` is an error, not ``--epochs``), and a mistyped
flag of a subcommand prints that subcommand's usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import traceback
from dataclasses import fields
from pathlib import Path

import torch

import ngra
from ngra import compiler, explain, kernels, settings
from ngra.datasets import describe, load
from ngra.errors import DistributedError, TrainingDivergedError
from ngra.models import MODELS, Defaults, defaults_table
from ngra.partition import build_book, parse_bytes, reorder_dataset, save_book
from ngra.runtime.placement import move_to, placed, plan_placement, resident_bytes, resolve_device
from ngra.training import TrainConfig, load_model
from ngra.training.config import DECODERS, NEGATIVES, READOUTS, STRATEGIES, TASKS
from ngra.training.interrupt import Interrupted, interruptible, interrupted_line, resume_note
from ngra.training.predict import save_predictions
from ngra.training.run import train

__all__ = ["main", "build_parser", "explain_model", "EXIT_BAD_INPUT", "EXIT_CRASHED",
           "EXIT_DIVERGED", "EXIT_RANK_FAILED"]

#: Exit status when the input cannot work: arguments, dataset, damaged or missing files.
EXIT_BAD_INPUT = 2
#: Exit status when training diverged (a non-finite loss, gradient or weight).
EXIT_DIVERGED = 3
#: Exit status when a rank of a multi-process run failed otherwise (killed, crashed).
EXIT_RANK_FAILED = 1
#: Exit status when ngra itself failed unexpectedly (a bug, an unforeseen fault): the
#: same code as a crashed rank.
EXIT_CRASHED = 1
#: A rank's error of these types is bad input (exit 2), as it would be on one process.
_BAD_INPUT_TYPES = {"ValueError", "TypeError", "DatasetError", "SpecError", "DamagedFileError",
                    "CheckpointError", "BookError", "FileNotFoundError", "PermissionError"}


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="full-graph node classification training",
                       description="Train a zoo model or your own (--model module:callable) "
                                   "full-graph and write a JSON summary.",
                       epilog="model defaults (a flag a model has no setting for is an error):\n"
                              + defaults_table() + "\n\ndatasets:\n" + describe(),
                       formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--model", default="gcn", metavar="NAME|MODULE:CALLABLE",
                   help=f"a zoo model ({', '.join(sorted(MODELS))}) or your own factory, "
                        "module:callable, called as f(num_features, num_classes, **given "
                        "hyper-parameters) and returning an nn.Module (default: gcn)")
    p.add_argument("--dataset", default="sbm",
                   help="dataset spec: cora, citeseer, pubmed, sbm[:...], rmat:scale=..., "
                        "edgelist:PATH, ogb:PATH, twitter (default: sbm)")
    p.add_argument("--epochs", type=int, default=200,
                   help="epochs to train (the ceiling with --patience) (default: 200)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the model's initial weights, dropout and generated datasets' "
                        "split (default: 0)")
    _add_hyper(p, "hidden", "heads", "lr", "weight_decay", "dropout", "attention_dropout")
    p.add_argument("--num-layers", type=int, default=None,
                   help="SAGA layers of a zoo model (default: 2); given to your factory as "
                        "num_layers= only when set")
    p.add_argument("--normalize-features", action=argparse.BooleanOptionalAction, default=None,
                   help="row-normalize non-negative features (default: per model; GCN and GAT "
                        "do, as their papers)")
    p.add_argument("--runs", type=int, default=1, metavar="K",
                   help="train K seeds (seed, seed+1, ...) and report the mean and std of "
                        "their accuracies (default: 1)")
    p.add_argument("--patience", type=int, default=None, metavar="P",
                   help="stop when validation loss and accuracy have not improved for P "
                        "epochs (the GAT paper's rule; --epochs is the ceiling; default: off)")
    p.add_argument("--data-root", default=None,
                   help="dataset folder (default: $NGRA_DATA or ~/.ngra/data)")
    p.add_argument("--out", default=None, help="write the JSON summary here")
    p.add_argument("--checkpoint", default=None, metavar="DIR", help="save checkpoints in DIR")
    p.add_argument("--checkpoint-every", type=int, default=10, metavar="N",
                   help="save a checkpoint every N epochs, and at the last (default: 10)")
    p.add_argument("--resume", action="store_true",
                   help="continue from DIR/checkpoint.pt (DIR/checkpoint.prev.pt if it is damaged)")
    p.add_argument("--threads", type=int, default=None, help="torch/numba threads")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (default: a tqdm bar on stderr)")
    p.add_argument("--explain", action="store_true",
                   help="print the compiled plan of each layer before training")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="stream every layer in tiles that fit SIZE (e.g. 2GB, 512MB)")
    p.add_argument("--reorder", default="none", choices=["none", "degree", "rcm", "metis"],
                   help="relabel vertices for locality before tiling (default: none)")
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N: on a GPU, train device-resident when it fits, "
                        "else stream tiles to it (default: cpu)")
    p.add_argument("--cuda-graphs", default="auto", choices=["auto", "on", "off"],
                   help="replay the device-resident training step from a CUDA graph after "
                        "warm-up: auto where it is safe (else eager, with the reason in the "
                        "summary's cuda_graph), on: refuse to run without it, off "
                        "(default: auto)")
    t = p.add_argument_group("tasks: node classification (default), link prediction, graph "
                             "classification")
    t.add_argument("--task", default="node", choices=TASKS,
                   help="node: classify vertices; link: predict edges (the encoder embeds, a "
                        "decoder scores pairs; metric ROC-AUC, Hits@K beside it); graph: "
                        "classify graphs of a collection such as tu:PATH (default: node)")
    t.add_argument("--val", type=float, default=0.05,
                   help="link/graph: share of edges (graphs) held out for validation "
                        "(default: 0.05)")
    t.add_argument("--test", type=float, default=0.1,
                   help="link/graph: share held out for test (default: 0.1)")
    t.add_argument("--embedding-dim", type=int, default=64,
                   help="link/graph: the encoder's output width, given to your factory as "
                        "its second argument (default: 64)")
    t.add_argument("--decoder", default="dot", choices=DECODERS,
                   help="link: score pairs by dot product, an MLP on their Hadamard "
                        "product, or DistMult over the dataset's edge types (the split "
                        "holds out typed pairs; an R-GCN encoder reads the types) "
                        "(default: dot)")
    t.add_argument("--negatives", default="uniform", choices=NEGATIVES,
                   help="link: draw each epoch's training negatives uniformly or in "
                        "proportion to degree**0.75 (default: uniform)")
    t.add_argument("--readout", default="sum", choices=READOUTS,
                   help="graph: how node embeddings are pooled per graph (default: sum)")
    t.add_argument("--batch-size", type=int, default=128,
                   help="graph: graphs per batch (default: 128)")
    p.add_argument("--allow-split-overlap", action="store_true",
                   help="train although the train, validation and test splits share vertices "
                        "(refused by default, with the counts)")
    p.add_argument("--storage", default="memory", choices=["memory", "disk", "auto"],
                   help="read the dataset into memory, map it from its cache entry on disk, "
                        "or auto: disk when it would not fit the memory available (or the "
                        "budget) (default: memory)")
    d = p.add_argument_group("several processes (gloo on the CPU, NCCL with one GPU a rank)")
    d.add_argument("--allow-oversubscribe", action="store_true",
                   help="start --nprocs processes that may not fit in memory, and more "
                        "--nprocs x --threads than cores, without refusal or warning")
    d.add_argument("--nprocs", type=int, default=1,
                   help="train on this many processes, the graph partitioned between them "
                        "(--task graph: each batch's graphs split between them; default: 1; "
                        "under torchrun, its process count)")
    d.add_argument("--exchange", default="auto", choices=STRATEGIES,
                   help="how remote source rows arrive: halo all_to_all, ring streaming, "
                        "feature columns (each rank aggregates a slice of the columns over "
                        "the whole graph), or the cost model's pick per layer (default: auto)")
    d.add_argument("--halo-overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="the halo exchange travels while a rank computes the edges whose "
                        "sources it owns, forward and backward; --no-halo-overlap: it "
                        "blocks (default: overlap)")
    d.add_argument("--halo-bits", type=int, default=None, metavar="8",
                   help="halo rows and their gradients travel as 8-bit integers with a "
                        "per-row scale, about a quarter of the bytes, not exact (default: "
                        "exact)")
    d.add_argument("--halo-staleness", type=int, default=0, metavar="1",
                   help="1: a training step reads the halo rows and gradients of the step "
                        "before (PipeGCN), so the exchange overlaps a whole step; not exact "
                        "(default: 0, exact)")
    d.add_argument("--partition", default=None, metavar="DIR",
                   help="a partition book from `ngra partition` (default: partition on the "
                        "fly, cached beside the dataset cache)")
    d.add_argument("--partition-method", default="metis", choices=["metis", "range"],
                   help="how an on-the-fly partition is made (default: metis)")
    d.add_argument("--plan", default=None, metavar="auto|FILE",
                   help="how the processes split the dense layers: auto (the planner's pick, "
                        "ngra plan) or a plans file from `ngra plan --out`; recorded in the "
                        "summary's `plan`")
    d.add_argument("--dist-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a collective waiting longer than this fails the run (default: 300)")


def _add_partition(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("partition", help="partition a dataset's graph for several processes",
                       description="Write a partition book (owner of every vertex, each "
                                   "rank's destination range, in-edges and exact halo) and "
                                   "its figures (edge cut, halo rows, balance).")
    p.add_argument("--dataset", required=True, help="dataset spec, as for `ngra train`")
    p.add_argument("--parts", type=int, required=True, help="number of processes (ranks)")
    p.add_argument("--method", default="metis", choices=["metis", "range"],
                   help="metis: few cut edges; range: contiguous original ids (default: metis)")
    p.add_argument("--out", required=True, metavar="DIR", help="write the book here")
    p.add_argument("--seed", type=int, default=0, help="METIS seed (default: 0)")
    p.add_argument("--reorder", default="none", choices=["none", "degree", "rcm", "metis"],
                   help="relabel vertices first, as `ngra train --reorder` (default: none)")
    p.add_argument("--data-root", default=None, help="dataset folder")


def _add_explain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="show how the compiler lowers a model's layers",
                       description="Print each layer's compiled plan: passes, hoisted terms, "
                                   "reorder decision, kernels, and why a pattern did not fuse.")
    p.add_argument("--model", default="gcn", metavar="NAME|MODULE:CALLABLE",
                   help=f"a zoo model ({', '.join(sorted(MODELS))}) or your own factory, as "
                        "for `ngra train` (default: gcn)")
    p.add_argument("--dataset", default="sbm", help="dataset spec, as for `ngra train`")
    _add_hyper(p, "hidden", "heads")
    p.add_argument("--num-layers", type=int, default=None,
                   help="SAGA layers of a zoo model (default: 2)")
    p.add_argument("--data-root", default=None, help="dataset folder")
    p.add_argument("--generic", action="store_true",
                   help="explain with compilation disabled (the generic executor)")
    p.add_argument("--device", default="cpu", help="explain the plan on this device (cpu, cuda)")
    p.add_argument("--memory-budget", default=None,
                   help="on cuda: the device budget (as for `ngra train`); where the run "
                        "does not fit it, show the streaming schedule and its bytes")


def _add_hyper(p: argparse.ArgumentParser, *names: str) -> None:
    """One flag per zoo hyper-parameter (``--weight-decay`` for ``weight_decay``), its help
    from the defaults table's field."""


    meta = {f.name: f.metadata for f in fields(Defaults)}
    for name in names:
        p.add_argument(f"--{name.replace('_', '-')}", type=meta[name]["type"], default=None,
                       help=f"{meta[name]['help']} (default: per model, see below)")


def _add_characterize(sub: argparse._SubParsersAction) -> None:
    from ngra.characterize import command  # lazy: matplotlib, kept out of spawned ranks

    command.add_parser(sub)


def _add_plan(sub: argparse._SubParsersAction) -> None:
    from ngra.planner import command  # lazy: as _add_characterize

    command.add_parser(sub)


def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="run a trained model (a checkpoint folder) on a dataset",
                       description="Write each vertex's predicted label, class scores or "
                                   "the output of a named layer (embeddings) from a "
                                   "checkpoint folder of `ngra train --checkpoint DIR`.")
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="the checkpoint folder (its selected weights and how to rebuild the "
                        "model)")
    p.add_argument("--dataset", required=True,
                   help="dataset spec, as for `ngra train` (features as wide as in training)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="where to write: .npy (an array) or .csv (vertex id, then values)")
    p.add_argument("--output", default="labels", choices=["labels", "scores", "probabilities"],
                   help="per vertex: the predicted class, the class scores (logits) or their "
                        "softmax (default: labels)")
    p.add_argument("--embeddings", default=None, metavar="LAYER",
                   help="write the output of this layer instead (e.g. layers.0; an unknown "
                        "name lists the model's layers)")
    p.add_argument("--model", default=None, metavar="MODULE:CALLABLE",
                   help="the factory, for a checkpoint of a model given in memory")
    p.add_argument("--data-root", default=None, help="dataset folder")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ngra", description="GNN training and analysis with ngra.",
                                     allow_abbrev=False)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_predict(sub)
    _add_partition(sub)
    _add_explain(sub)
    _add_characterize(sub)
    _add_plan(sub)
    sub.add_parser("info", help="versions and available kernel backends")
    for p in sub.choices.values():
        p.allow_abbrev = False  # --epoch is a mistake, not --epochs
    return parser


def _cmd_train(args: argparse.Namespace) -> int:
    names = {f.name for f in fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in names})
    summary = train(cfg, echo=print)
    name, data = summary["model"], summary["dataset"]
    for s in summary["results"] or [summary]:
        seed = f" seed {s['seed']}" if summary["results"] else ""
        stop = f", stopped early after {s['epochs']} epochs" if s["stopped_early"] else ""
        m = "acc" if s["metric"] == "accuracy" else s["metric"]
        print(f"{name} on {data}{seed}: test_{m}={s['test_acc']:.4f} "
              f"val_{m}={s['val_acc']:.4f} (best epoch {s['best_epoch']}{stop}) "
              f"epoch_time={s['epoch_time_s'] * 1e3:.1f} ms peak_rss={s['peak_rss_mb']:.0f} MB")
    if summary["results"]:
        print(f"{name} on {data}, {summary['runs']} runs (seeds "
              f"{summary['seeds'][0]}-{summary['seeds'][-1]}): test_acc "
              f"{summary['test_acc_mean']:.4f} +- {summary['test_acc_std']:.4f}, val_acc "
              f"{summary['val_acc_mean']:.4f} +- {summary['val_acc_std']:.4f} (mean +- std)")
    if cfg.out:
        print(f"summary written to {cfg.out}")
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix not in (".npy", ".csv"):
        raise ValueError(f"--out {args.out}: expected a .npy or .csv file name.")
    predictor = load_model(args.checkpoint, model=args.model)
    values = predictor.predict(args.dataset, output=args.output, embeddings=args.embeddings,
                               root=args.data_root).detach().cpu().numpy()
    labels = not args.embeddings and args.output == "labels"
    save_predictions(values, out, label="label" if labels else None)
    what = f"layer {args.embeddings}" if args.embeddings else args.output
    print(f"{what} of {len(values)} vertices ({list(values.shape)}) written to {out}")
    return 0


def _cmd_partition(args: argparse.Namespace) -> int:
    if args.parts < 1:
        raise ValueError(f"--parts must be >= 1; got {args.parts}.")
    ds = load(args.dataset, root=args.data_root)
    if args.reorder != "none":
        ds = reorder_dataset(ds, args.reorder, seed=args.seed)
    book = build_book(ds.graph, args.parts, args.method, args.seed,
                      spec=ds.info.get("spec", args.dataset))
    save_book(book, args.out)
    print(book.describe())
    print(f"partition book written to {args.out} (book.pt; figures in book.json)")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    ctx = compiler.disabled() if args.generic else contextlib.nullcontext()
    with ctx:
        print(explain_model(args.model, args.dataset, hidden=args.hidden, heads=args.heads,
                            num_layers=args.num_layers, data_root=args.data_root,
                            device=args.device, memory_budget=args.memory_budget))
    return 0


def explain_model(model: str, dataset: str, *, hidden: int | None = None,
                  heads: int | None = None, num_layers: int | None = None,
                  data_root: str | None = None, device: str = "cpu",
                  memory_budget: str | None = None) -> str:
    """``ngra explain --model M --dataset D``: :func:`ngra.explain` of model ``M`` (a zoo
    name or a factory's ``module:callable``) built for dataset ``D`` and its graph
    prepared as training prepares it, on ``device``: the same plan shape, dispatched to
    that device's kernels. On a CUDA device the run is placed as ``ngra train`` places it
    (within ``memory_budget``): a run that does not fit shows each layer's streaming
    schedule and the bytes it moves."""


    cfg = TrainConfig(model=model, dataset=dataset, hidden=hidden, heads=heads,
                      num_layers=num_layers)
    source, resolved = cfg.source, cfg.resolved()
    ds = load(dataset, root=data_root)
    graph, edge_data = source.prepare(ds.graph, ds.edge_type, ds.num_edge_types)
    net = source.build(ds.x.shape[1], ds.num_classes, hyper=resolved,
                       num_layers=resolved["num_layers"],
                       num_edge_types=ds.num_edge_types)
    dev = resolve_device(device)
    x, ctx, where = ds.x, contextlib.nullcontext(), ""
    if dev.type == "cuda":
        budget = parse_bytes(memory_budget) if memory_budget else None
        place = plan_placement(dev, resident_bytes(graph, ds.x, net), budget=budget)
        where = f"\nplacement: {place.describe()}"
        if place.resident:
            graph, x, edge_data = move_to(dev, graph, ds.x, edge_data)
        else:
            ctx = placed(place)
    (net,) = move_to(dev, net)
    head = (f"ngra explain: {source.name} on {dataset} ({graph.num_nodes} nodes, "
            f"{graph.num_edges} edges, {ds.x.shape[1]} features, {ds.num_classes} classes) "
            f"on {dev}{where}")
    with ctx:
        return head + "\n\n" + explain(net, graph, x, edge_data)


def _cmd_characterize(args: argparse.Namespace) -> int:
    from ngra.characterize import command  # lazy: as _add_characterize

    return command.run(args)


def _cmd_plan(args: argparse.Namespace) -> int:
    from ngra.planner import command  # lazy: as _add_characterize

    return command.run(args)


def _cmd_info(args: argparse.Namespace) -> int:
    info = {"ngra": ngra.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(),
            "gspmm_backends": kernels.available("gspmm"),
            # every NGRA_* variable, resolved now, and the scoped (with-block) settings
            "settings": [{"name": r.name, "value": r.value, "source": r.source, "doc": r.doc}
                         for r in settings.resolved()],
            "scoped": settings.SCOPED}
    print(json.dumps(info, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's usage, not the top level's
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    handlers = {"train": _cmd_train, "predict": _cmd_predict, "partition": _cmd_partition,
                "explain": _cmd_explain,
                "info": _cmd_info, "characterize": _cmd_characterize, "plan": _cmd_plan}

    def fail(line: str, code: int) -> int:
        if args.verbose:  # -v: the traceback too
            traceback.print_exc()
        print(f"ngra {args.command}: {line}", file=sys.stderr)
        return code

    try:
        with interruptible():
            return handlers[args.command](args)
    except Interrupted as exc:
        # SIGINT / SIGTERM: what was being written was removed on the way out
        if args.verbose:
            logging.exception("interrupted")
        print(interrupted_line(exc, args.command, getattr(args, "checkpoint", None), argv),
              file=sys.stderr)
        return exc.exit_code
    except DistributedError as exc:
        if exc.cause == "TrainingDivergedError":
            return fail(f"error: {exc}", EXIT_DIVERGED)
        return fail(f"error: {exc}",
                    EXIT_BAD_INPUT if exc.cause in _BAD_INPUT_TYPES else EXIT_RANK_FAILED)
    except TrainingDivergedError as exc:
        return fail(f"error: {exc}", EXIT_DIVERGED)
    except (ValueError, TypeError, OSError) as exc:
        # bad arguments, unusable or damaged data, missing or unwritable files, a full disk
        return fail(f"error: {exc}", EXIT_BAD_INPUT)
    except Exception as exc:  # a bug or an unforeseen fault: one line, not a traceback
        return fail(crash_line(exc, args, argv), EXIT_CRASHED)


def crash_line(exc: BaseException, args: argparse.Namespace, argv: list[str]) -> str:
    """What ``ngra`` says (after ``ngra <command>: ``) when ``exc`` ended a command that no
    documented error explains: its type and first line, how to see the traceback and, for
    ``train``, where the run can resume from."""
    text = str(exc).strip().splitlines()
    line = f"crashed: {type(exc).__name__}" + (f": {text[0]}" if text else "")
    if not args.verbose:
        line += " (run with -v for the traceback)"
    if args.command == "train":
        line += "; " + resume_note(getattr(args, "checkpoint", None), argv)
    return line

if __name__ == "__main__":
    sys.exit(main())
