"""One training run from a :class:`~ngra.training.config.TrainConfig`: what ``ngra train``
and :func:`ngra.fit` both call.

:func:`run` resolves the model (:class:`~ngra.training.model_source.ModelSource`) and the
data (:func:`~ngra.training.data.as_dataset`), checks both before training (the
configuration, the files it will write, the data's trainability, a user model's output
shape, and for several processes that the model runs on a part of the graph), then trains
on one process (a :class:`~ngra.training.loop.Session` per seed, placed on the device by
:mod:`ngra.runtime.placement`) or on ``nprocs`` ranks (:mod:`ngra.training.ranks`), and
returns an :class:`Outcome`: the JSON summary (:mod:`ngra.training.summary`'s schema) and
the trained model with its selected weights.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from torch import nn

from ngra.datasets.linksplit import LinkSplit
from ngra.diskspace import write_file
from ngra.distributed.launch import in_worker
from ngra.errors import DatasetError
from ngra.graph import Graph
from ngra.memstat import rss_bytes
from ngra.partition import parse_bytes
from ngra.planner.train_plans import training_plan
from ngra.runtime.placement import (Placement, move_to, plan_placement, resident_bytes,
                                    resolve_device)
from ngra.training.config import TrainConfig, check_config, check_run_files, describe_run
from ngra.training.resources import check_resources
from ngra.training.data import as_dataset, fingerprint, prepare_dataset
from ngra.training.loop import Session, fit_runs
from ngra.training.model_source import ModelSource, call_model
from ngra.training.ranks import train_distributed
from ngra.training.graph_ranks import load_graphs, train_graph_distributed
from ngra.training.graph_task import GraphSession, graph_model, graph_parts
from ngra.training.link_ranks import train_link_distributed
from ngra.training.link_task import LinkModel, LinkSession, link_split, make_decoder

__all__ = ["Outcome", "check_model_output", "check_partitionable", "check_predictions_vary",
           "plan_for", "run", "train"]

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What a run leaves: its JSON ``summary`` and its ``model`` holding the selected
    weights (of the run with the best validation accuracy among several seeds)."""

    summary: dict[str, Any]
    model: nn.Module | None
    meta: dict[str, Any]


def train(cfg: TrainConfig, echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train per ``cfg``; the JSON summary (also written to ``cfg.out``)."""
    return run(cfg, echo).summary


def run(cfg: TrainConfig, echo: Callable[[str], None] | None = None) -> Outcome:
    """Train per ``cfg`` (module docstring). ``echo`` gets the run's header and, with
    ``cfg.explain``, the compiled plans (default: logged at INFO). The summary is also
    written to ``cfg.out``."""
    say = echo or log.info
    check_config(cfg)
    check_run_files(cfg)
    check_resources(cfg.nprocs, cfg.threads, cfg.allow_oversubscribe)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    main = os.environ.get("RANK", "0") == "0"  # not another torchrun rank
    several = cfg.nprocs > 1 or in_worker()
    if cfg.plan is not None and in_worker():
        raise ValueError("--plan is not supported under torchrun; start the processes "
                         "with ngra train --nprocs K --plan ...")
    loaded: dict[str, Any] = {}
    given, label = cfg, cfg.dataset_name

    def load() -> tuple[Any, dict[str, Any]]:
        """The prepared dataset and the checkpoint metadata (once, by one process)."""
        budget = parse_bytes(given.memory_budget) if given.memory_budget else None
        ds = as_dataset(given.dataset, root=given.data_root, storage=given.storage,
                        budget=budget, allow_overlap=given.allow_split_overlap)
        synthesized = list(ds.info.get("synthesized", []))
        log.info("ngra train config: %s", json.dumps(given.resolved(), sort_keys=True,
                                                     default=str))
        say(describe_run(given, synthesized))
        ds = prepare_dataset(ds, reorder=given.reorder, seed=given.seed,
                             normalize=given.resolved()["normalize_features"])
        if several and not given.source.zoo:
            check_partitionable(given, ds)
        loaded["about"] = {"reciprocity": ds.reciprocity, "dataset_summary": ds.summary(),
                           "synthesized": synthesized}
        return ds, _meta(given, ds, label)

    if cfg.task != "node":
        outcome = _train_task(cfg, echo)
    elif not several:
        ds, meta = load()
        outcome = _train_here(cfg, ds, echo, meta, loaded["about"])
    else:
        cfg = replace(cfg, dataset=label)  # ranks get its name, not data held in memory
        if cfg.plan is not None:
            cfg = replace(cfg, extra={**cfg.extra, "plan": plan_for(cfg)})
            say(f"dense layers: plan {cfg.extra['plan']['used']['label']} (--plan {cfg.plan})")
        summary, state, meta = train_distributed(cfg, load, echo)
        model = None
        if main:
            summary.update(loaded.get("about", {}), device=str(cfg.device), storage="memory")
            for r in summary["results"] or []:
                r.update(loaded.get("about", {}), device=str(cfg.device), storage="memory")
            if state is not None and (cfg.source.kind != "factory" or cfg.source.importable
                                      or callable(cfg.source.factory)):
                model = _build(cfg, meta["num_features"], meta["num_classes"],
                               meta["num_edge_types"])
                model.load_state_dict(state)
        outcome = Outcome(summary, model, meta or {})
    if cfg.out and main:  # whole or not at all: a full disk is DiskFullError, nothing half-written
        write_file(cfg.out, json.dumps(outcome.summary, indent=2) + "\n", "the JSON summary")
    return outcome


def _train_task(cfg: TrainConfig, echo: Callable[[str], None] | None) -> Outcome:
    """A link-prediction or graph-classification run (:mod:`ngra.training.link_task`, :mod:`ngra.training.graph_task`)."""
    say = echo or log.info
    r = cfg.resolved()
    several = cfg.nprocs > 1 or in_worker()  # under torchrun: one of its ranks

    def encoder(num_features: int, num_edge_types: int = 1) -> nn.Module:
        return _build(cfg, num_features, cfg.embedding_dim, num_edge_types)

    meta = {**_model_meta(cfg), "embedding_dim": cfg.embedding_dim, "decoder": cfg.decoder,
            "readout": cfg.readout}
    if cfg.task == "graph":
        gds = load_graphs(cfg)
        if os.environ.get("RANK", "0") == "0":  # not another torchrun rank
            say(describe_run(cfg, []))
        parts = graph_parts(gds, cfg.val, cfg.test, cfg.seed)
        info = {"dataset_summary": gds.summary(), "reciprocity": None, "synthesized": [],
                "storage": "memory", "resident_mb": rss_bytes() / 2**20}
        meta.update(num_features=gds.num_features, num_classes=gds.num_outputs,
                    task_type=gds.task_type,
                    dataset={"name": cfg.dataset_name, "graphs": len(gds)})

        if several:
            info.pop("resident_mb")  # each rank's own
            summary, state = train_graph_distributed(cfg, gds, parts, info, meta, echo)
            if state is None:  # another torchrun rank: rank 0 holds the model
                return Outcome(summary, None, meta)
            model = graph_model(cfg, gds.num_features, gds.num_outputs)
            model.load_state_dict(state)
            return Outcome(summary, model, meta)

        def session(seed: int) -> GraphSession:
            return GraphSession(graph_model(cfg, gds.num_features, gds.num_outputs), gds,
                                parts, batch_size=cfg.batch_size, seed=seed,
                                budget=cfg.memory_budget, info=info)
    else:
        def load() -> tuple[Any, LinkSplit, dict[str, Any]]:
            """The prepared dataset, its edge split and the summary's facts about them
            (under torchrun: on rank 0 alone); ``meta`` takes their sizes."""
            budget = parse_bytes(cfg.memory_budget) if cfg.memory_budget else None
            ds = as_dataset(cfg.dataset, root=cfg.data_root, check=False, storage=cfg.storage,
                            budget=budget)
            synthesized = list(ds.info.get("synthesized", []))
            say(describe_run(cfg, [s for s in synthesized if s != "labels"]))
            ds = prepare_dataset(ds, reorder=cfg.reorder, seed=cfg.seed,
                                 normalize=r["normalize_features"])
            split = link_split(cfg, ds)
            info = {"dataset_summary": {**ds.summary(), "link_split": split.summary()},
                    "reciprocity": ds.reciprocity, "synthesized": synthesized,
                    "storage": ds.info.get("storage", "memory"),
                    "resident_mb": rss_bytes() / 2**20}
            meta.update(num_features=ds.num_features, num_classes=None,
                        dataset={"name": cfg.dataset_name, "fingerprint": fingerprint(ds)},
                        num_edge_types=split.num_relations, num_relations=split.num_relations)
            return ds, split, info

        def link_model() -> LinkModel:
            k = meta["num_relations"]
            return LinkModel(encoder(meta["num_features"], k),
                             make_decoder(cfg.decoder, cfg.embedding_dim, k))

        if several:
            summary, state, meta = train_link_distributed(cfg, load, meta, echo)
            if state is None:  # another torchrun rank: rank 0 holds the model
                return Outcome(summary, None, meta)
            model = link_model()
            model.load_state_dict(state)
            return Outcome(summary, model, meta)
        ds, split, info = load()
        graph, edge_data = cfg.source.prepare(split.graph, split.edge_type, split.num_relations)

        def session(seed: int) -> LinkSession:
            return LinkSession(link_model(), split, graph, ds.x, edge_data, seed=seed,
                               negatives=cfg.negatives, budget=cfg.memory_budget, info=info)

    summary, best = fit_runs(cfg, session, echo, meta=meta)
    return Outcome(summary, best, meta)


def plan_for(cfg: TrainConfig, can_measure: bool = True) -> dict[str, Any]:
    """The dense layers' plan record of run ``cfg`` (``--plan``), from the planner."""
    if not cfg.source.zoo:
        raise ValueError(f"--plan prices a zoo model's dense layers; {cfg.model_name} is "
                         "your own (plan it with `ngra plan --module ...`).")
    r = cfg.resolved()
    return training_plan(cfg.plan, cfg.model_name, cfg.dataset_name, cfg.nprocs,
                         hidden=r["hidden"], heads=r["heads"], num_layers=r["num_layers"],
                         data_root=cfg.data_root, partition=cfg.partition,
                         method=cfg.partition_method, reorder=cfg.reorder, seed=cfg.seed,
                         memory_budget=cfg.memory_budget, can_measure=can_measure)


def _model_meta(cfg: TrainConfig) -> dict[str, Any]:
    """What a checkpoint keeps to rebuild ``cfg``'s model, whatever the task."""
    r = cfg.resolved()
    return {"model": cfg.source.record(), "task": cfg.task,
            "factory_kwargs": ModelSource.factory_kwargs(
                r, None if cfg.source.zoo else r["num_layers"]),
            "hyper": {k: r[k] for k in ("hidden", "heads", "dropout", "attention_dropout",
                                        "lr", "weight_decay", "num_layers")},
            "normalize_features": bool(r["normalize_features"])}


def _meta(cfg: TrainConfig, ds: Any, label: str) -> dict[str, Any]:
    """:func:`_model_meta`, and the node dataset's sizes and fingerprint."""
    return {**_model_meta(cfg),
            "num_features": ds.num_features, "num_classes": ds.num_classes,
            "num_edge_types": ds.num_edge_types,
            "dataset": {"name": label, "fingerprint": fingerprint(ds),
                        "num_nodes": ds.num_nodes, "num_edges": ds.num_edges}}


def _build(cfg: TrainConfig, num_features: int, num_outputs: int,
           num_edge_types: int = 1) -> nn.Module:
    """A fresh model of ``cfg`` (``resolved()["num_layers"]`` is the zoo's 2 when unset,
    and a factory's own default, ``None``, for a user's model)."""
    r = cfg.resolved()
    return cfg.source.build(num_features, num_outputs, hyper=r, num_layers=r["num_layers"],
                            num_edge_types=num_edge_types)


def _train_here(cfg: TrainConfig, ds: Any, echo: Callable[[str], None] | None,
                meta: dict[str, Any], about: dict[str, Any]) -> Outcome:
    device = resolve_device(cfg.device)
    source = cfg.source
    graph, edge_data = source.prepare(ds.graph, ds.edge_type, ds.num_edge_types)
    num_nodes, num_edges = ds.graph.num_nodes, ds.graph.num_edges
    if graph is not ds.graph:  # the model's graph replaces the dataset's: one copy alive
        ds = replace(ds, graph=graph, edge_type=None, num_edge_types=1)
    masks = {"train": ds.train_mask, "val": ds.val_mask, "test": ds.test_mask}
    about["resident_mb"] = rss_bytes() / 2**20  # data in memory (or mapped) and prepared
    about["storage"] = ds.info.get("storage", "memory")

    def session(seed: int) -> Session:  # one run's model, seeded by fit_runs
        model = _build(cfg, meta["num_features"], meta["num_classes"], meta["num_edge_types"])
        if not source.zoo:
            check_model_output(model, graph, ds.x, edge_data, ds.num_classes, source.name)
        placement = _placement(device, cfg, graph, ds.x, model,
                               [ds.y, edge_data, *masks.values()])
        log.info("placement: %s", placement.describe())
        g, x, y, e, m = graph, ds.x, ds.y, edge_data, masks
        if device.type == "cuda" and placement.resident:
            g, x, y, e, model = move_to(device, g, x, y, e, model)
            m = dict(zip(m, move_to(device, *m.values())))
        elif device.type == "cuda":  # streaming: the parameters live on the device
            (model,) = move_to(device, model)
        check_predictions_vary(model, g, x, e, cfg.model_name, cfg.dataset_name)
        return Session(model, g, x, e, y, m, cfg.memory_budget, num_nodes, num_edges,
                       device, placement, about)

    summary, best = fit_runs(cfg, session, echo, meta=meta)
    return Outcome(summary, best, meta)


@torch.no_grad()
def check_model_output(model: nn.Module, graph: Any, x: torch.Tensor, edge_data: Any,
                       num_classes: int, name: str) -> None:
    """Fail before training when ``model`` does not give ``[N, num_classes]`` scores."""
    was = model.training
    model.eval()
    try:
        out = call_model(model, graph, x, edge_data)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"model {name} fails on the data before training: {exc}") from exc
    finally:
        model.train(was)
    want = [graph.num_nodes, num_classes]
    if not isinstance(out, torch.Tensor) or list(out.shape) != want or not out.is_floating_point():
        got = (f"a {type(out).__name__}" if not isinstance(out, torch.Tensor)
               else f"{out.dtype} {list(out.shape)}")
        raise ValueError(f"model {name} must return class scores [num_nodes, num_classes] = "
                         f"{want} (float) for node classification; it returned {got}.")


def check_partitionable(cfg: TrainConfig, ds: Any) -> None:
    """Fail before several processes start when a user's model cannot train on a part of
    the graph: a parameter or buffer with one row per vertex of the whole graph, or a
    forward that fails (or returns other rows) on an induced subgraph of other size, as
    it would on a rank (e.g. one that adds a tensor held outside the model)."""
    model = _build(cfg, ds.num_features, ds.num_classes, ds.num_edge_types)
    n = ds.num_nodes
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if n > max(ds.num_features, ds.num_classes) and n in t.shape:
            raise ValueError(f"model {cfg.model_name} cannot train on {cfg.nprocs} processes: "
                             f"its {name} {list(t.shape)} holds a row per vertex of the whole "
                             f"graph ({n}), and each process holds only its part. Train it on "
                             "one process (nprocs=1).")
    m = max(1, min(n - 1, 1024))
    sub, x = _induced_prefix(ds, m)
    graph, graph_edge = cfg.source.prepare(sub, None, 1)
    try:
        with torch.no_grad():
            model.eval()
            out = call_model(model, graph, x, graph_edge)
    except Exception as exc:  # the user's forward may fail in any way
        raise ValueError(f"model {cfg.model_name} cannot train on {cfg.nprocs} processes: on "
                         f"a part of the graph ({m} of its {n} vertices, as a process holds) "
                         f"its forward fails: {type(exc).__name__}: {exc}. A model for several "
                         "processes must compute from the graph and rows it is given (no "
                         "tensor sized by the whole graph). Train it on one process.") from None
    if not isinstance(out, torch.Tensor) or out.shape[0] != m:
        raise ValueError(f"model {cfg.model_name} cannot train on {cfg.nprocs} processes: on a "
                         f"part of the graph with {m} vertices it returns "
                         f"{getattr(out, 'shape', type(out).__name__)}, not {m} rows.")


def _induced_prefix(ds: Any, m: int) -> tuple[Any, torch.Tensor]:
    """The subgraph induced by vertices ``[0, m)`` and their features."""
    g = ds.graph
    ip = g.indptr[:m + 1].to(torch.int64)
    src = g.indices[:int(ip[-1])].to(torch.int64)
    dst = torch.repeat_interleave(torch.arange(m), ip[1:] - ip[:-1])
    keep = src < m
    return (Graph.from_edge_index(torch.stack([src[keep], dst[keep]]), num_nodes=m),
            ds.x[:m].clone())


@torch.no_grad()
def check_predictions_vary(model: nn.Module, graph: Any, x: torch.Tensor, edge_data: Any,
                           model_name: str, dataset: str) -> None:
    """On a graph with no edges, fail if the model predicts the same for every vertex.

    A model that reads a vertex only through its in-edges (G-GCN) sees nothing there;
    models that also read the vertex's own features train as MLPs and pass.
    """
    if graph.num_edges or graph.num_nodes < 2:
        return
    model.eval()
    out = call_model(model, graph, x, edge_data)
    if bool((out == out[:1]).all()):
        raise DatasetError(
            f"{dataset} has no edges, and {model_name} reads a vertex only through its "
            "in-edges: it would predict the same class for every vertex. Use a model that "
            "also reads the vertex's own features (gcn, sage, gat, gin), or a graph with edges."
        )


def _placement(device: torch.device, cfg: TrainConfig, graph: Any, x: torch.Tensor,
               model: nn.Module, extra: list[Any]) -> Placement:
    """Where this run trains (see :mod:`ngra.runtime.placement`)."""
    budget = parse_bytes(cfg.memory_budget) if cfg.memory_budget else None
    more = sum(t.numel() * t.element_size() for t in _tensors(extra))
    return plan_placement(device, resident_bytes(graph, x, model, more), budget=budget)


def _tensors(items: list[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for it in items:
        if isinstance(it, torch.Tensor):
            out.append(it)
        elif isinstance(it, dict):
            out += [v for v in it.values() if isinstance(v, torch.Tensor)]
    return out
