"""Multi-process full-graph training: partition, shard, launch, and one loop per rank.

``ngra train --nprocs K`` (:func:`train_distributed` in the launching process):

1. loads the dataset, checks that ``K`` ranks can share it, and takes a partition book of
   ``K`` parts, or of a ``--plan``'s ``d`` row partitions (``dp d x tp t``: ``t`` ranks a
   partition, :mod:`ngra.distributed.dense`):
   ``--partition DIR`` (made by ``ngra partition``; refused if it belongs to another
   graph or is stale), else the one cached beside the dataset cache (built on the fly,
   ``--partition-method metis|range``, rebuilt when stale);
2. writes each rank's shard of the model's prepared graph (:mod:`ngra.distributed.shards`,
   cached beside the book), so that no rank loads the whole dataset;
3. starts ``K`` ranks (:func:`ngra.distributed.launch`: gloo on the CPU, NCCL with one GPU
   a rank) which each run :func:`run_rank` and return rank 0's summary.

``torchrun --nproc_per_node K -m ngra train ...`` starts the ranks itself; rank 0 then
does steps 1-2 while the others wait.

On a rank, :class:`RankSession` gives ``ngra.training.loop.fit`` the rank's share: the model in
buckets of gradients all-reduced while backward runs (:mod:`ngra.distributed.gradsync`),
the training loss as each rank's sum over its rows divided by the global count (so the
summed gradients are one process's), accuracies from correct counts summed over the ranks,
and every forward inside :func:`ngra.kernels.dropout_rows` with the rows' original ids
(the same dropout masks as one process, on any number of ranks; attention dropout hashes
its masks from each local edge's id in the whole graph, ``DistGraph.edge_ids``, likewise).
The validation loss for early stop is reduced with the accuracies, so every rank stops at
the same epoch; ``--runs`` trains each seed in turn on the same ranks
(:func:`ngra.training.loop.fit_runs`). Only rank 0 writes files and shows progress; with
``--halo-staleness 1`` a checkpoint also keeps every rank's stale halo rows and gradients
(gathered to rank 0, :meth:`RankSession.checkpoint_state`), which a run resumed on the
same ranks and shards reads at its first step (another process count or partition: an
exact first step, logged and in the summary's ``stale_halos_resumed``). The summary
adds ``world_size``, each layer's exchange, bytes sent a training step per rank (counted
at the sends), the partition's figures and each rank's peak memory and step time, and
``memory_per_rank``: each rank's peak (``VmHWM``), what its partition requires
(:func:`ngra.distributed.memory.partition_bytes` for the layers it ran, by part) and its
RSS before its shard.

A rank serves allocations of :data:`RANK_LARGE_FREE_BYTES` (8 MiB) and more with their
own mappings (:func:`ngra.memstat.release_large_frees`, as a memory budget does from
1 MiB): its per-step temporaries (owned- and halo-row activations, exchange buffers) are
mostly 1-32 MiB, which glibc would take from heap arenas that keep freed pages, and a
rank's peak then grew with every epoch (R-MAT 2^20 GCN on 4 ranks, range, halo: the
largest rank 924 MB after 4 epochs, 1,259 MB -- one process's peak -- after 100). From
8 MiB it stays at 828 MB after 30 epochs (from 1 MiB: 761 MB; from 32 MiB it grows as
before); freshly mapped pages fault in every step: 2 ranks, R-MAT 2^20 872 -> 985 ms an
epoch, ego-Twitter 63 -> 65-67 ms (from 1 MiB: 80 ms, its 1-8 MiB temporaries mapped too);
4 ranks on 2 cores, R-MAT 2^20 904 -> 1,161 ms.

A rank's fixed cost is mostly torch and numba: a Cora GCN rank on the CPU peaks at about
377 MB (:mod:`ngra.distributed.launch` itemizes it and what is kept out). A CPU rank loads
numba's implementations first, without ``scipy.linalg``
(``ngra.kernels.cpu.load_implementations``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ngra.datasets.base import data_root, writable
from ngra.datasets.cache import book_folder, cache_root
from ngra.distributed.cost import check_structure_fits
from ngra.distributed.dense import DenseLayout, rank_groups, split_linears
from ngra.distributed.gradsync import GradientSync
from ngra.distributed.graph import exchange_table
from ngra.distributed.launch import in_worker, init_process_group, launch
from ngra.distributed.link import link_model
from ngra.distributed.memory import LayerWidths, partition_bytes
from ngra.distributed.shards import build_shards, load_shard, shard_sizes, shards_current
from ngra.kernels import dropout_rows
from ngra.memstat import io_read_bytes, mapped_from, peak_rss_bytes, release_large_frees, rss_bytes
from ngra.partition import BOOK_SEED, book_for, parse_bytes
from ngra.runtime.budget import memory_budget
from ngra.runtime.explain import explain
from ngra.saga import SagaLayer
from ngra.training.config import TrainConfig
from ngra.training.data import as_dataset, fingerprint, prepare_dataset
from ngra.training.loop import fit_runs, grid_report
from ngra.training.model_source import call_model
from ngra.training.resources import RankShare, check_rank_data, local_ranks

__all__ = ["RankSession", "from_rank_zero", "named_failure", "open_shard", "prepare_shards",
           "rank_threads", "run_rank", "torchrun_group", "train_distributed"]

log = logging.getLogger(__name__)

#: A rank maps allocations of this size and more (see the module docstring).
RANK_LARGE_FREE_BYTES = 8 << 20


def train_distributed(cfg: TrainConfig, load: Callable[[], tuple[Any, dict[str, Any]]],
                      echo: Callable[[str], None] | None = None
                      ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
    """``cfg`` over ``cfg.nprocs`` ranks (or, inside ``torchrun``, as one of them):
    ``load()`` gives the prepared dataset and the checkpoint metadata (called once, by the
    launching process or torchrun's rank 0). Returns rank 0's ``(summary, selected
    weights, metadata)`` (the weights and metadata ``None`` on other torchrun ranks)."""
    if in_worker():
        return _torchrun_rank(cfg, load, echo)
    ds, meta = load()
    folder = prepare_shards(cfg, ds)
    del ds
    # the fixed cost was checked before loading; now each rank's share of the data too
    check_rank_data(rank_shares(folder), cfg.allow_oversubscribe)
    results = launch(_rank_main, cfg.nprocs, cfg, str(folder), meta,
                     timeout_s=cfg.dist_timeout, threads=rank_threads(cfg), device=_device(cfg))
    summary, state = results[0]
    if echo is not None and cfg.explain and summary.get("explain"):
        echo(summary["explain"])
    return summary, state, meta


def rank_shares(folder: Path) -> list[RankShare]:
    """Each rank's share of the data, by rank: its shard's bytes, rows and in-edges."""
    return [RankShare(*size) for size in shard_sizes(folder)]


def rank_threads(cfg: TrainConfig) -> int:
    """Threads a rank computes with: ``--threads``, else the cores shared out."""
    return cfg.threads or max(1, (os.cpu_count() or 1) // cfg.nprocs)


def _device(cfg: TrainConfig) -> str:
    return "cuda" if str(cfg.device).startswith("cuda") else "cpu"


def _load_numba() -> None:
    """numba's implementations, which a CPU rank's first kernel call would load, loaded
    without ``scipy.linalg`` (15 MB of its fixed cost: ``ngra.kernels.cpu._target``)."""
    try:
        from ngra.kernels.cpu import load_implementations  # lazy: numba, CPU ranks only
    except ImportError:  # no numba: the "ref" backend
        return
    load_implementations()


def _rank_main(cfg: TrainConfig, folder: str, meta: dict[str, Any]) -> Any:
    summary, model = run_rank(cfg, Path(folder), meta)
    if dist.get_rank() != 0:
        return None
    return summary, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _torchrun_rank(cfg: TrainConfig, load: Callable[[], tuple[Any, dict[str, Any]]],
                   echo: Callable[[str], None] | None) -> tuple[dict[str, Any], Any, Any]:
    rank, _ = torchrun_group(cfg)

    def prepare() -> tuple[str, dict[str, Any]]:
        ds, meta = load()
        folder = prepare_shards(cfg, ds)
        del ds
        # this host's ranks run already: their shares of the data against what is left
        check_rank_data(rank_shares(folder), cfg.allow_oversubscribe, ranks=local_ranks(),
                        started=True)
        return str(folder), meta

    folder, meta = from_rank_zero(prepare)
    with named_failure():
        summary, model = run_rank(cfg, Path(folder), meta)
    dist.destroy_process_group()
    if rank == 0 and echo is not None and cfg.explain and summary.get("explain"):
        echo(summary["explain"])
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()} if rank == 0 else None
    return summary, state, meta if rank == 0 else None


# ---------------------------------------------------------------- torchrun
def torchrun_group(cfg: TrainConfig) -> tuple[int, int]:
    """As one of the processes ``torchrun`` started: the default group initialized and
    ``cfg.nprocs`` set to its process count; returns ``(rank, world size)``."""
    init_process_group(timeout_s=cfg.dist_timeout, device=_device(cfg))
    rank, k = dist.get_rank(), dist.get_world_size()
    if cfg.nprocs not in (1, k):
        raise ValueError(f"--nprocs {cfg.nprocs} disagrees with torchrun's {k} processes; "
                         "leave --nprocs out under torchrun.")
    cfg.nprocs = k
    return rank, k


def from_rank_zero(prepare: Callable[[], Any]) -> Any:
    """``prepare()`` run by rank 0 alone (what it writes -- caches, shards -- is written
    once) while the other ranks wait; its result (picklable), or its error, on every
    rank: a failure ends every rank at once, not at a collective's timeout."""
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = prepare()
        except Exception as exc:  # every rank must hear of it, not wait for a timeout
            box[0] = exc
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]


@contextlib.contextmanager
def named_failure() -> Iterator[None]:
    """A torchrun rank's training: an error names the rank on stderr and ends the process
    at once (a teardown could block on peers waiting in a collective), so torchrun stops
    the others within seconds."""
    try:
        yield
    except BaseException as exc:
        sys.stderr.write(f"ngra train: rank {dist.get_rank()} of {dist.get_world_size()}: "
                         f"error: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        os._exit(1)


# ---------------------------------------------------------------- shards
def prepare_shards(cfg: TrainConfig, ds: Any = None) -> Path:
    """Check that ``cfg.nprocs`` ranks can share the prepared dataset ``ds`` (default:
    ``cfg.dataset`` loaded and prepared as a run does), take the partition book, and
    make sure every rank's shard for ``cfg``'s model is written; returns the shards'
    folder."""
    if ds is None:
        ds = prepare_dataset(as_dataset(cfg.dataset, root=cfg.data_root), reorder=cfg.reorder,
                             seed=cfg.seed, normalize=cfg.resolved()["normalize_features"])
    if cfg.nprocs > ds.graph.num_nodes:
        raise ValueError(f"--nprocs {cfg.nprocs} is more processes than {cfg.dataset_name} "
                         f"has vertices ({ds.graph.num_nodes}); use at most "
                         f"{ds.graph.num_nodes}.")
    source = cfg.source
    # shards of row-normalized features apart from raw ones (each rebuilt only when stale)
    key = source.prep_key() + ("+rownorm" if cfg.resolved()["normalize_features"] else "")
    # the plan's row partitions (default: --nprocs)
    parts = DenseLayout.of(cfg.nprocs, cfg.extra.get("plan")).data
    spec = ds.info.get("spec") or f"memory:{fingerprint(ds)}"
    cache = book_folder(spec, parts, method=cfg.partition_method, reorder=cfg.reorder,
                        seed=BOOK_SEED, data_root=cfg.data_root)
    book, folder = book_for(
        ds.graph, parts, spec=spec, cache=cache, book_dir=cfg.partition,
        method=cfg.partition_method, asked=None if parts == cfg.nprocs
        else f"the plan splits the rows of {cfg.nprocs} processes")
    shards = folder / "shards" / key
    if not writable(folder):
        shards = (cache_root(data_root(cfg.data_root)) / "partitions" / "shards"
                  / f"{book.fingerprint[:16]}-{parts}-{key}")
    if not shards_current(shards, ds, source, book):
        if shards.exists():
            shutil.rmtree(shards)
        build_shards(ds, source, book, shards, progress=cfg.progress)
    if cfg.exchange == "feature" and cfg.memory_budget:
        meta = json.loads((shards / "meta.json").read_text())
        check_structure_fits(meta["num_nodes"], meta["num_edges"],
                             parse_bytes(cfg.memory_budget))
    return shards


# ---------------------------------------------------------------- one rank
class RankSession:
    """One rank's share of the training loop (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, shard: Any, budget: str | None,
                 group: Any = None, layout: DenseLayout | None = None) -> None:
        self.model = self.net = self.encoder = model
        self.shard, self.budget = shard, budget
        self.group, self.layout = group, layout  # gradients' and sums' group; the plan's
        self.graph, self.x, self.edge_data = shard.graph, shard.x, shard.edge_data
        self.y, self.masks = shard.y, shard.masks
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        meta = shard.meta
        self.num_nodes, self.num_edges = meta["num_nodes"], meta["num_edges"]
        self.sizes = meta["split_sizes"]
        self.sync = GradientSync(model.parameters(), group=group, traffic=shard.graph.traffic)
        self.sync.broadcast_parameters()
        self.steps: list[dict[str, int]] = []
        self.resident = rss_bytes()  # the shard loaded: this rank's data in memory
        self._widths: dict[int, tuple[int, int]] = {}  # a layer's input and output widths
        for m in model.modules():
            if isinstance(m, SagaLayer):
                m.register_forward_hook(self._layer_widths)
        self.read_start = io_read_bytes()

    def context(self) -> Any:
        stack = contextlib.ExitStack()
        stack.enter_context(dropout_rows(self.shard.row_ids))
        if self.budget:
            stack.enter_context(memory_budget(self.budget))
        return stack

    def _sum(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach().clone()
        dist.all_reduce(t, group=self.group)  # one rank a replica: each row counted once
        return t

    metric = "accuracy"
    last_metrics: dict[str, float] = {}

    def batches(self, epoch: int) -> tuple[None]:
        """An epoch's steps: one, over this rank's share of the graph."""
        return (None,)

    def forward(self, batch: Any = None) -> torch.Tensor:
        return call_model(self.net, self.graph, self.x, self.edge_data)

    def loss(self, out: torch.Tensor, batch: Any = None) -> tuple[torch.Tensor, float]:
        m = self.masks["train"]
        n = max(self.sizes["train"], 1)
        local = F.cross_entropy(out[m], self.y[m], reduction="sum")
        # each rank's share of the global mean: the summed gradients are one process's
        return local / n, float(self._sum(local)) / n

    def after_backward(self) -> None:
        self.sync.finish()

    @torch.no_grad()
    def evaluate(self) -> tuple[dict[str, float], float]:
        """Accuracies and the validation loss over every rank's rows (one all_reduce: the
        same figures, hence the same early-stop decision, on every rank)."""
        self.model.eval()
        with self.context():
            logits = call_model(self.model, self.graph, self.x, self.edge_data)
        pred = logits.argmax(-1)
        names = list(self.masks)
        val = self.masks["val"]
        sums = torch.tensor([float((pred[self.masks[k]] == self.y[self.masks[k]]).sum())
                             for k in names]
                            + [float(F.cross_entropy(logits[val], self.y[val], reduction="sum"))],
                            dtype=torch.float64)
        sums = self._sum(sums).tolist()
        acc = {k: float(c) / self.sizes[k] if self.sizes[k] else float("nan")
               for k, c in zip(names, sums)}
        return acc, sums[-1] / self.sizes["val"] if self.sizes["val"] else float("nan")

    def explain(self) -> str:
        with self.context():
            plans = explain(self.model, self.graph, self.x, self.edge_data)
            if self.budget:
                plans += "\n" + grid_report(self.model, self.graph, self.x, self.edge_data)
        return plans

    #: how a resumed run's stale halos began (``extra``'s ``stale_halos_resumed``)
    stale_resume: str | None = None

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint keeps beside the loop's state (collective: every rank calls
        it; rank 0's return is saved): with ``--halo-staleness 1`` every rank's stale halo
        rows and gradients (:meth:`~ngra.distributed.graph.DistGraph.stale_state`), with
        the rank count and the shards' stamp they belong to."""
        if not self.graph.staleness:
            return {}
        mine = self.graph.stale_state()
        everyone: list[Any] = [None] * self.world if self.is_main else None
        dist.gather_object(mine, everyone, dst=0)
        if not self.is_main:
            return {}
        return {"stale_halos": {"world_size": self.world, "stamp": _stamp_text(self.shard),
                                "ranks": everyone}}

    def restore_state(self, ck: dict[str, Any]) -> None:
        """Take up what :meth:`checkpoint_state` saved in the checkpoint ``ck`` resumed
        from: this rank's stale halos, when the checkpoint's ranks and shards are this
        run's; else the first step reads exact halos, and a log line (and the summary's
        ``stale_halos_resumed``) says why."""
        if not self.graph.staleness:
            return
        saved = ck.get("stale_halos")
        if saved is None:
            why = "the checkpoint holds no stale halos (written without --halo-staleness)"
        elif saved["world_size"] != self.world:
            why = (f"the checkpoint's stale halos are of {saved['world_size']} ranks, this "
                   f"run has {self.world}")
        elif saved["stamp"] != _stamp_text(self.shard):
            why = "the checkpoint's stale halos are of another partition or graph"
        else:
            self.graph.restore_stale(saved["ranks"][self.rank])
            self.stale_resume = "the checkpoint's stale halo rows and gradients"
            return
        self.stale_resume = f"exact halos at the first step: {why}"
        if self.is_main:
            log.warning("--halo-staleness 1: %s", self.stale_resume)

    def _layer_widths(self, layer: torch.nn.Module, args: tuple, out: Any) -> None:
        self._widths[id(layer)] = (_width(args[1]) if len(args) > 1 else 0, _width(out))

    def required_bytes(self) -> dict[str, int] | None:
        """What this rank's partition requires (:func:`~ngra.distributed.memory.
        partition_bytes`, by part and ``total``) for the layers it ran; ``None`` before a
        layer ran."""
        g = self.graph
        layers = [LayerWidths(self._widths[id(lay)][0], row, self._widths[id(lay)][1])
                  for lay, row in g.layers() if id(lay) in self._widths]
        if not layers:
            return None
        e = max(g.num_edges, 1)
        edata = self.edge_data
        edge_bytes = (sum(t.nbytes for t in edata.values()) if isinstance(edata, dict)
                      else edata.nbytes if isinstance(edata, torch.Tensor) else 0) // e
        local = g.local
        return partition_bytes(
            g.stats, g.rank, features=int(self.x.shape[1]) if self.x.dim() > 1 else 1,
            classes=self.shard.meta["num_classes"], layers=layers,
            params=sum(p.numel() for p in self.model.parameters()),
            factors=local.edge_factors is not None,
            edge_weight=local.weighted and local.edge_factors is None,
            edge_data_bytes=edge_bytes, overlap=g.overlap, staleness=g.staleness)

    def step_begin(self) -> None:
        """Before each training step (the exchange counts its own traffic)."""

    def step_done(self) -> None:
        self.steps.append(self.graph.traffic.take())

    def extra(self, times: list[float]) -> dict[str, Any]:
        step = self.steps[-1] if self.steps else {}
        required = self.required_bytes()
        mine = {"bytes": {**step, "total": sum(step.values())},
                "peak_rss_mb": peak_rss_bytes() / 2**20,
                "memory": {"peak_rss": peak_rss_bytes(),
                           "required_bytes": (required or {}).get("total"),
                           "required": required,
                           "fixed_bytes": self.shard.start_rss},
                "resident_mb": self.resident / 2**20,
                "disk_read_mb": (io_read_bytes() - self.read_start) / 2**20,
                "peak_device_mb": (torch.cuda.max_memory_allocated() / 2**20
                                   if self.x.is_cuda else None),
                "epoch_time_s": statistics.median(times) if times else float("nan"),
                "large_frees_released": mapped_from() is not None,
                "exchange": self.graph.exchange_stats()}
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, mine)
        link = self.graph.link
        return {
            "world_size": self.world,
            "exchange": self.graph.choices(),
            "exchange_per_layer": exchange_table([e["exchange"] for e in everyone]),
            "bytes_sent_per_epoch": {"per_rank": [e["bytes"] for e in everyone],
                                     "total": sum(e["bytes"]["total"] for e in everyone),
                                     "note": "one training step (forward, backward, gradient "
                                             "all-reduce), counted at the sends"},
            "partition": self.shard.meta["figures"],
            "partition_stats": self.shard.meta["stats"],  # the cost model's inputs
            "peak_rss_mb_per_rank": [e["peak_rss_mb"] for e in everyone],
            "peak_rss_mb": max(e["peak_rss_mb"] for e in everyone),
            # VmHWM, what the partition requires, the RSS before the shard (bytes)
            "memory_per_rank": [e["memory"] for e in everyone],
            "resident_mb": max(e["resident_mb"] for e in everyone),  # the largest rank's
            "disk_read_mb": sum(e["disk_read_mb"] for e in everyone),
            "placement": f"{self.x.device}: {self.world} processes, the graph partitioned",
            **({"peak_device_mb_per_rank": [e["peak_device_mb"] for e in everyone]}
               if self.x.is_cuda else {}),
            "epoch_time_s_per_rank": [e["epoch_time_s"] for e in everyone],
            # each rank's large temporaries in their own mappings (the module docstring)
            "large_frees_released": all(e["large_frees_released"] for e in everyone),
            "link": link.describe() if link is not None else None,
            "dense_layout": self.layout.describe() if self.layout is not None else None,
            **({"stale_halos_resumed": self.stale_resume} if self.stale_resume else {}),
        }


def _width(v: Any) -> int:
    """Values a row of ``v`` (a tensor ``[N, ...]``, or a dict / sequence of them)."""
    if isinstance(v, torch.Tensor):
        return math.prod(v.shape[1:]) if v.dim() > 1 else 1
    if isinstance(v, dict):
        return sum(_width(t) for t in v.values())
    if isinstance(v, (tuple, list)):
        return sum(_width(t) for t in v)
    return 0


def _stamp_text(shard: Any) -> str:
    """The shards' stamp (book, graph, preparation, rank count) as one string."""
    return json.dumps(shard.meta["stamp"], sort_keys=True)


def open_shard(cfg: TrainConfig, folder: Path) -> tuple[Any, DenseLayout, Any]:
    """This rank's shard from ``folder`` (on its GPU under NCCL), the dense layout of
    ``cfg``'s plan and the rank's process groups; large frees released as the module
    docstring says."""
    rank = dist.get_rank()
    release_large_frees(RANK_LARGE_FREE_BYTES)  # a peak bounded over epochs
    device = _device(cfg)
    layout = DenseLayout.of(cfg.nprocs, cfg.extra.get("plan"))
    groups = rank_groups(layout, device)  # the exchange's own group, apart from gradients'
    link = link_model(device=device)  # forced strategies still report both predictions
    shard = load_shard(folder, layout.replica(rank), layout.data, group=groups.exchange,
                       exchange=cfg.exchange, link=link, overlap=cfg.halo_overlap,
                       halo_bits=cfg.halo_bits, staleness=cfg.halo_staleness)
    if device == "cuda":  # NCCL: this rank's GPU (launch set it from LOCAL_RANK)
        shard = shard.to(torch.device("cuda", torch.cuda.current_device()))
    return shard, layout, groups


def run_rank(cfg: TrainConfig, folder: Path,
             meta: dict[str, Any] | None = None) -> tuple[dict[str, Any], torch.nn.Module]:
    """Train on this rank's shard (the default group initialized); returns the summary and
    the model (holding the selected weights). ``meta`` goes into checkpoints."""
    if _device(cfg) == "cpu":
        _load_numba()
    shard, layout, groups = open_shard(cfg, folder)
    resolved = cfg.resolved()
    sizes = shard.meta

    def session(seed: int) -> RankSession:  # one run's model, seeded by fit_runs
        model = cfg.source.build(sizes["num_features"], sizes["num_classes"], hyper=resolved,
                                 num_layers=resolved["num_layers"],
                                 num_edge_types=sizes["num_edge_types"])
        model = split_linears(model.to(shard.x.device), layout, groups.tp)
        return RankSession(model, shard, cfg.memory_budget, groups.gradients, layout)

    return fit_runs(cfg, session, meta=meta)
