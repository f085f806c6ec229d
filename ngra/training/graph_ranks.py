"""Graph classification on several processes: ``ngra train --task graph --nprocs K``.

Data parallel over graphs. The launching process loads the
:class:`~ngra.datasets.GraphDataset` and splits it
(:func:`~ngra.training.graph_task.graph_parts`) as one process does, checks that ``K``
ranks can each hold it, and starts the ranks
(:func:`ngra.distributed.launch`); each rank loads the same dataset (a spec is loaded
again, data given in memory is handed over) and takes the same split. Under ``torchrun``
(``torchrun --nproc_per_node K -m ngra train --task graph ...``) each process is one of
the ranks: rank 0 reads the dataset first (:func:`load_graphs`: a download or cache is
written once) while the others wait, then they read it, split it alike and train as
above; rank 0 writes the summary, and a rank that fails names itself and ends the run
(:func:`ngra.training.ranks.named_failure`).

On a rank, :class:`GraphRankSession` runs one process's epoch:

1. the batches are one process's: the training graphs' order is drawn from
   ``(seed, epoch)`` (:meth:`GraphLoader.order`) and cut into ``batch_size`` batches;
2. each rank collates its **share** of a batch: the contiguous slice of its ``B`` graphs
   from position ``floor(B r / K)`` to ``floor(B (r + 1) / K)``. A small last batch may
   leave a rank an empty share: it runs the model on an empty batch (0 graphs), so it
   draws the same dropout seeds and meets its peers in the gradient all-reduce;
3. dropout masks are drawn by the share's node positions in the whole batch
   (:func:`ngra.kernels.dropout_rows`), so every rank draws the part of one process's
   mask it holds;
4. the loss is the rank's cross-entropy sum over its graphs divided by ``B`` (binary
   tasks: its BCE sum over its labeled entries divided by the whole batch's labeled
   entries, which every rank counts from the batch's ids), and the gradients are summed
   over the ranks (:mod:`ngra.distributed.gradsync`): one optimizer step is one process's
   step on the whole batch (to float tolerance: the sums run in another order).

Evaluation: each rank evaluates its share (the same contiguous slice) of the training,
validation and test graphs; the correct counts and the validation loss sum are
all-reduced, so every rank has one process's accuracies and takes the same early-stop
decision. ROC-AUC and AP (binary tasks) are no sums of per-rank parts: every rank's
scores and labels are gathered (``all_gather_object``, in rank order) and each rank
computes the metric over all of a part's graphs, as one process does. Only rank 0 shows
progress and writes checkpoints; a checkpoint holds the same state as one process's, so a
run resumes on any process count.

BatchNorm: every ``nn.BatchNorm1d`` of the model is swapped on the ranks for a
:class:`~ngra.distributed.batchnorm.SyncBatchNorm1d` (:func:`~ngra.distributed.batchnorm.sync_batch_norm`):
a batch's statistics are summed over the ranks' shares (an empty share joins the sums),
forward and backward, and the running statistics are one process's, so K ranks train as
one process (``placement`` says so). Another kind of BatchNorm (2-d, a subclass with a
forward of its own) is left as it is: it normalizes each share by the share's own
statistics, and the run warns and says so in ``placement``.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ngra.datasets import GraphBatch, GraphDataset, GraphLoader, collate
from ngra.distributed.batchnorm import SyncBatchNorm1d, sync_batch_norm
from ngra.distributed.gradsync import GradientSync
from ngra.distributed.halo import Traffic
from ngra.distributed.launch import in_worker, launch
from ngra.kernels import dropout_rows
from ngra.memstat import peak_rss_bytes, rss_bytes
from ngra.training.config import TrainConfig
from ngra.training.graph_task import (GraphModel, GraphSession, accuracies, graph_dataset,
                                      graph_model, loss_sum)
from ngra.training.loop import fit_runs
from ngra.training.ranks import (from_rank_zero, named_failure, rank_threads,
                                 torchrun_group)
from ngra.training.resources import RankShare, check_rank_data, local_ranks

__all__ = ["GraphRankSession", "Share", "load_graphs", "share_bounds",
           "train_graph_distributed"]

log = logging.getLogger(__name__)


def train_graph_distributed(cfg: TrainConfig, ds: GraphDataset, parts: dict[str, np.ndarray],
                            info: dict[str, Any], meta: dict[str, Any],
                            echo: Callable[[str], None] | None = None
                            ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Train graph classification over ``cfg.nprocs`` ranks (or, under ``torchrun``, as
    one of them) on the graphs ``parts`` of ``ds`` (``info`` goes into the summary,
    ``meta`` into checkpoints); returns rank 0's ``(summary, selected weights)`` (the
    weights ``None`` on other torchrun ranks)."""
    if in_worker():
        torchrun_group(cfg)
    k, train = cfg.nprocs, int(parts["train"].size)
    if k > train:
        raise ValueError(f"--nprocs {k} is more processes than {cfg.dataset_name} has "
                         f"training graphs ({train}); use at most {train}.")
    # every rank holds the whole dataset
    share = RankShare(_nbytes(ds), int(ds.node_ptr[-1]), int(ds.indices.numel()))
    if in_worker():  # this host's ranks run already: their data against what is left
        from_rank_zero(lambda: check_rank_data([share] * k, cfg.allow_oversubscribe,
                                               ranks=local_ranks(), started=True))
        with named_failure():
            summary, state = _rank_main(cfg, ds, parts, info, meta)
        dist.destroy_process_group()
        if state is not None and echo is not None and cfg.explain and summary.get("explain"):
            echo(summary["explain"])
        return summary, state
    check_rank_data([share] * k, cfg.allow_oversubscribe)
    source: Any = cfg.dataset if isinstance(cfg.dataset, str) else ds
    rank_cfg = replace(cfg, dataset=cfg.dataset_name)  # data in memory travels once, as source
    results = launch(_rank_main, k, rank_cfg, source, parts, info, meta,
                     timeout_s=cfg.dist_timeout, threads=rank_threads(cfg))
    summary, state = results[0]
    if echo is not None and cfg.explain and summary.get("explain"):
        echo(summary["explain"])
    return summary, state


def _nbytes(ds: GraphDataset) -> int:
    tensors = (ds.indptr, ds.indices, ds.node_ptr, ds.x, ds.y, ds.edge_attr, ds.edge_label,
               ds.node_label)
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def load_graphs(cfg: TrainConfig) -> GraphDataset:
    """The graphs of run ``cfg`` (:func:`~ngra.training.graph_task.graph_dataset`); under
    ``torchrun`` read by rank 0 first (what reading writes, a download or a cache, is
    written once) while the others wait, then by the others."""
    if not in_worker():
        return graph_dataset(cfg.dataset, root=cfg.data_root)
    torchrun_group(cfg)
    held: list[GraphDataset] = []
    from_rank_zero(lambda: held.append(graph_dataset(cfg.dataset, root=cfg.data_root)))
    return held[0] if held else graph_dataset(cfg.dataset, root=cfg.data_root)


def _rank_main(cfg: TrainConfig, source: Any, parts: dict[str, np.ndarray],
               info: dict[str, Any], meta: dict[str, Any]
               ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One rank's runs: its summary, and on rank 0 the selected weights."""
    ds = graph_dataset(source, root=cfg.data_root) if isinstance(source, str) else source
    info = {**info, "resident_mb": rss_bytes() / 2**20}

    def session(seed: int) -> GraphRankSession:
        model = graph_model(cfg, ds.num_features, ds.num_outputs)
        return GraphRankSession(model, ds, parts, batch_size=cfg.batch_size, seed=seed,
                                budget=cfg.memory_budget, info=info)

    summary, model = fit_runs(cfg, session, meta=meta)
    if dist.get_rank() != 0:
        return summary, None
    return summary, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def share_bounds(size: int, rank: int, world: int) -> tuple[int, int]:
    """Positions ``[lo, hi)`` of rank ``rank``'s contiguous share of ``size`` items."""
    return size * rank // world, size * (rank + 1) // world


@dataclass(frozen=True)
class Share:
    """This rank's graphs of one training batch.

    Attributes:
        batch: the share's graphs, collated (0 graphs when the share is empty).
        total: the loss's divisor: graphs in the whole batch, or (binary tasks) its
            labeled entries.
        first_row: the batch position of the share's first node (its dropout rows).
    """

    batch: GraphBatch
    total: int
    first_row: int


def _is_batch_norm(m: nn.Module) -> bool:
    return isinstance(m, nn.modules.batchnorm._BatchNorm)


class GraphRankSession(GraphSession):
    """One rank's share of a graph-classification run (module docstring)."""

    def __init__(self, model: GraphModel, ds: GraphDataset, parts: dict[str, np.ndarray], *,
                 batch_size: int, seed: int, budget: str | None, info: dict[str, Any],
                 group: Any = None, sync_norm: bool = True) -> None:
        # before anything runs the model: its BatchNorm1d layers share the batch's statistics
        self.synced_norms = sync_batch_norm(model) if sync_norm else 0
        super().__init__(model, ds, parts, batch_size=batch_size, seed=seed, budget=budget,
                         info=info)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.is_main, self.group = self.rank == 0, group
        self.traffic = Traffic()
        self.sync = GradientSync(model.parameters(), group=group, traffic=self.traffic)
        self.sync.broadcast_parameters()
        self.eval_loaders = {part: GraphLoader(d.subset(np.arange(*share_bounds(
            len(d), self.rank, self.world))), batch_size) for part, d in self.parts.items()}
        self.node_counts = np.diff(self.parts["train"].node_ptr.numpy())
        self.rows: torch.Tensor | None = None  # the current share's dropout rows
        self.steps: list[dict[str, int]] = []
        self.per_rank_norms = sorted({type(m).__name__ for m in model.modules()
                                      if _is_batch_norm(m) and not isinstance(m, SyncBatchNorm1d)})
        if self.per_rank_norms and self.is_main:
            log.warning("the model's %s layers are not synchronized: each of the %d ranks "
                        "normalizes its share of a batch by the share's own statistics, so "
                        "results differ from one process's", ", ".join(self.per_rank_norms),
                        self.world)

    def context(self) -> Any:
        stack = contextlib.ExitStack()
        stack.enter_context(super().context())
        stack.enter_context(dropout_rows(self.rows))  # forward and backward of a share
        return stack

    def batches(self, epoch: int) -> Iterator[Share]:
        loader, train = self.train_loader, self.parts["train"]
        order, size = loader.order(epoch), loader.batch_size
        try:
            for b in range(len(loader)):
                idx = order[b * size:(b + 1) * size]
                lo, hi = share_bounds(idx.size, self.rank, self.world)
                first = int(self.node_counts[idx[:lo]].sum())
                batch = collate(train, idx[lo:hi])
                self.rows = torch.arange(first, first + batch.num_nodes)
                total = (int(idx.size) if self.task_type != "binary" else
                         int((~torch.isnan(train.y[torch.from_numpy(idx)])).sum()))
                yield Share(batch, total, first)
        finally:
            self.rows = None

    def forward(self, share: Share) -> torch.Tensor:
        b = share.batch
        return self.model(b.graph, b.x, b.ptr)

    def loss(self, out: torch.Tensor, share: Share) -> tuple[torch.Tensor, float]:
        local = loss_sum(out, share.batch.y, self.task_type)[0]
        # each rank's share of the batch mean: the summed gradients are one process's
        total = max(share.total, 1)
        return local / total, float(self._sum(local)) / total

    def after_backward(self) -> None:
        self.sync.finish()

    @torch.no_grad()
    def evaluate(self) -> tuple[dict[str, float], float]:
        if self.task_type == "binary":  # every rank's scores, in rank order
            everyone: list[Any] = [None] * self.world
            dist.all_gather_object(everyone, self.outputs(), group=self.group)
            return self.scored({part: tuple(torch.cat([e[part][i] for e in everyone])
                                            for i in (0, 1)) for part in everyone[0]})
        counts = self.counts()
        flat = self._sum(torch.tensor([v for c in counts.values() for v in c],
                                      dtype=torch.float64)).view(len(counts), -1).tolist()
        return accuracies(dict(zip(counts, flat)))

    def _sum(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach().to(torch.float64, copy=True)  # never the loss's own storage
        dist.all_reduce(t, group=self.group)
        return t

    def step_done(self) -> None:
        self.steps.append(self.traffic.take())

    def extra(self, times: list[float]) -> dict[str, Any]:
        step = self.steps[-1] if self.steps else {}
        mine = {"bytes": {**step, "total": sum(step.values())},
                "peak_rss_mb": peak_rss_bytes() / 2**20,
                "resident_mb": self.info.get("resident_mb"),
                "epoch_time_s": statistics.median(times) if times else float("nan")}
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, mine, group=self.group)
        placement = (f"cpu: {self.world} processes, each batch's graphs split between them"
                     + ("; BatchNorm statistics over all ranks (synchronized)"
                        if self.synced_norms else "")
                     + (f"; {', '.join(self.per_rank_norms)} statistics per rank (each over "
                        "its share of a batch)" if self.per_rank_norms else ""))
        return {
            **super().extra(times),
            "world_size": self.world,
            "bytes_sent_per_epoch": {"per_rank": [e["bytes"] for e in everyone],
                                     "total": sum(e["bytes"]["total"] for e in everyone),
                                     "note": "one epoch's gradient all-reduces, counted at "
                                             "the sends"},
            "peak_rss_mb_per_rank": [e["peak_rss_mb"] for e in everyone],
            "peak_rss_mb": max(e["peak_rss_mb"] for e in everyone),
            "resident_mb": max(e["resident_mb"] or 0.0 for e in everyone),
            "epoch_time_s_per_rank": [e["epoch_time_s"] for e in everyone],
            "placement": placement,
        }
