"""A zoo GNN on a dataset as a chain, priced with the partition books training uses, and
the plan ``ngra train --nprocs K --plan auto|FILE`` runs.

The graph exchange of a ``d``-way data-parallel plan is the halo of the busiest rank of
a ``d``-way partition book: ``--partition DIR`` for its part count, else the book
``ngra train --nprocs d`` caches beside the dataset (built and cached here if missing;
:func:`ngra.partition.book_for`), so that the planner and the run read
the same figures.

Full-graph training (:mod:`ngra.training.ranks`) runs plans without a pipeline:
``dp d x tp t`` on ``d``-way row partitions, each shared by ``t`` ranks that split the
plan's split Linears and run its replicated layers whole (:mod:`ngra.distributed.dense`).
Pipeline stages, micro-batches and recomputation cut a full-graph step into pieces the
graph trainer does not make; such plans run through :class:`ngra.planner.Runner` (a plain
MLP stack): ``--plan FILE`` naming one is refused, and ``--plan auto`` whose top pick is
one runs the fastest plan the trainer runs and records both in the summary.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ngra.datasets import load
from ngra.datasets.cache import book_folder
from ngra.distributed.link import calibrate, calibration_path, load_link
from ngra.models import MODELS, build_model, prepare
from ngra.partition import BOOK_SEED, book_for, load_book, parse_bytes, reorder_dataset
from ngra.planner.chain import Chain
from ngra.planner.cost import Devices, Shape
from ngra.planner.plan import ParallelPlan

__all__ = ["book_halos", "default_memory", "device_link", "runs_in_trainer", "training_plan",
           "zoo_chain"]

log = logging.getLogger(__name__)


def book_halos(ds: Any, dataset: str, parts: list[int], *, partition: str | None = None,
               method: str = "metis", data_root: str | None = None,
               reorder: str = "none") -> dict[int, int]:
    """``parts -> rows`` the busiest rank receives, from the partition books of training:
    the book in folder ``partition`` for its part count, the cached book of ``dataset``
    (``method``; ``reorder``: how ``ds`` was relabeled, part of the cache key) for the
    other counts.

    Raises:
        ValueError: ``partition``'s part count is not among ``parts``.
        BookError: the book belongs to another graph, or is stale.
    """
    from ngra.planner.gnn import book_halo

    given = None
    if partition:
        given = load_book(partition).num_parts
        if given not in parts:
            raise ValueError(f"the partition book in {partition} has {given} parts; "
                             f"{max(parts, default=1)} devices split rows {parts} ways. Give "
                             f"a multiple of {given} devices, or another book.")
    halo = {}
    for p in parts:
        spec = ds.info.get("spec", dataset)
        cache = book_folder(spec, p, method=method, reorder=reorder, seed=BOOK_SEED,
                            data_root=data_root)
        book, folder = book_for(ds.graph, p, spec=spec, cache=cache,
                                book_dir=partition if p == given else None, method=method)
        halo[p] = book_halo(book)
        log.info("%d-way partition (%s, %s): busiest rank's halo %d rows", p, book.method,
                 folder, halo[p])
    return halo


def zoo_chain(model: str, dataset: str, devices: int, *, hidden: int | None = None,
              heads: int | None = None, num_layers: int = 2, data_root: str | None = None,
              partition: str | None = None, method: str = "metis", reorder: str = "none",
              seed: int = 0) -> Chain:
    """The dense layers of zoo GNN ``model`` on ``dataset`` (:func:`ngra.planner.gnn_chain`),
    its exchange priced for every data-parallel degree of ``devices`` by :func:`book_halos`
    (on the dataset relabeled by ``reorder`` with ``seed``, as ``ngra train`` does)."""
    from ngra.planner.gnn import gnn_chain

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {sorted(MODELS)} or "
                         "mlp:W0,W1,...")
    ds = load(dataset, root=data_root)
    if reorder != "none":
        ds = reorder_dataset(ds, reorder, seed=seed)
    graph, edge_data = prepare(model, ds.graph, ds.edge_type, ds.num_edge_types)
    net = build_model(model, ds.x.shape[1], ds.num_classes, hidden=hidden, heads=heads,
                      num_layers=num_layers, num_edge_types=ds.num_edge_types)
    parts = [p for p in range(2, devices + 1) if devices % p == 0]
    halo = book_halos(ds, dataset, parts, partition=partition, method=method,
                      data_root=data_root, reorder=reorder)
    return gnn_chain(net, graph, ds.x, edge_data, halo=halo, name=f"{model} on {dataset}")


def device_link(devices: int, refresh: bool = False, *, measure: bool = True) -> Any:
    """The calibrated link of ``devices`` ranks on this machine: cached, else measured
    (``measure=False``: a clear error instead, for callers that cannot start ranks)."""

    cached = None if refresh else load_link(calibration_path("gloo", "cpu", devices))
    if cached is not None:
        return cached
    if not measure:
        raise ValueError(f"no link calibration of {devices} ranks on this machine; run "
                         f"`ngra plan --calibrate --devices {devices}` first.")
    log.warning("measuring the link and compute rates of %d rank(s) (once per machine)",
                devices)
    return calibrate(devices)


def default_memory(devices: int) -> float:
    """This machine's RAM shared by ``devices`` devices (bytes)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / devices


def runs_in_trainer(plan: ParallelPlan) -> bool:
    """Whether the graph trainer runs ``plan`` as it is: no pipeline, one micro-batch,
    nothing recomputed (module docstring)."""
    return (plan.pipeline == 1 and plan.micro_batches == 1
            and not any(s.recompute for s in plan.stages))


def training_plan(plan: str, model: str, dataset: str, nprocs: int, *,
                  hidden: int | None = None, heads: int | None = None, num_layers: int = 2,
                  data_root: str | None = None, partition: str | None = None,
                  method: str = "metis", reorder: str = "none", seed: int = 0,
                  memory_budget: str | None = None, can_measure: bool = True
                  ) -> dict[str, Any]:
    """The plan a ``ngra train --nprocs nprocs --plan plan`` run (``plan``: ``"auto"`` or a
    plans file) of zoo ``model`` on ``dataset`` uses for its dense layers, as the summary's
    ``plan`` record: ``used`` (what runs), ``planner_top`` (the planner's pick for
    ``auto``), ``note`` when they differ. The other arguments are the run's settings.

    Raises:
        ValueError: a plans file holding no plan for this model and process count, or one
            the graph trainer does not run (module docstring).
        NoFeasiblePlan: nothing fits the memory (``memory_budget`` per process, else this
            machine's RAM shared by the processes).
    """
    from ngra.planner.search import choose_plan, search

    k = nprocs
    chain = zoo_chain(model, dataset, k, hidden=hidden, heads=heads, num_layers=num_layers,
                      data_root=data_root, partition=partition, method=method,
                      reorder=reorder, seed=seed)
    memory = parse_bytes(memory_budget) if memory_budget else default_memory(k)
    devices = Devices(k, memory, device_link(k, measure=can_measure))
    chosen = choose_plan(plan, chain, devices)
    record: dict[str, Any] = {"source": plan}
    if runs_in_trainer(chosen):
        record["used"] = chosen.record()
        return record
    if plan != "auto":
        raise ValueError(
            f"--plan {plan}: its plan for {chain.name!r} is {chosen.label!r}; ngra train "
            "runs plans of data- and tensor-parallel dense layers (pp1, m1, no "
            "recomputation) over the partition. Pipeline, micro-batch and recomputation "
            "plans run through ngra.planner.Runner; give another plan or --plan auto.")
    used = next((p for p in search(chain, devices) if runs_in_trainer(p)), None)
    if used is None:  # the data-parallel plan always runs; priced here if search dropped it
        from ngra.planner.search import evaluate

        n = len(chain)
        used = evaluate(chain, devices, Shape(1, k, 1, 1), [(0, n, ("rep",) * n, False)])
    log.warning("the planner's top pick for %s on %d processes is %s (predicted %.1f ms a "
                "step); ngra train runs %s (predicted %.1f ms)", chain.name, k, chosen.label,
                chosen.predicted_time_s * 1e3, used.label, used.predicted_time_s * 1e3)
    record.update(used=used.record(), planner_top=chosen.record(),
                  note="the graph trainer runs no pipeline, micro-batches or recomputation; "
                       "the top pick runs through ngra.planner.Runner")
    return record
