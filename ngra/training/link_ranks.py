"""Link prediction on several processes: ``ngra train --task link --nprocs K``.

The launching process splits the edges once, exactly as one process does
(:func:`ngra.training.link_task.link_split`), and shards the **message-passing graph**
like a node-classification dataset (:func:`ngra.training.ranks.prepare_shards`; its
partition book and shards are cached under a spec naming the split, apart from the
whole graph's). It then writes, for each rank, the pairs whose **destination** the rank
owns, in the book's vertex ids: the training positives and the fixed validation and test
pairs; and the in-edges of the rank's vertices in the input's ids (what its negatives
must avoid). Beside them, for every rank, the book id of each input vertex and, for
degree-biased negatives, each vertex's weight.

Under ``torchrun`` (``torchrun --nproc_per_node K -m ngra train --task link ...``) each
process is one of the ranks: rank 0 loads and splits the dataset and writes the shards
and pairs while the others wait (:func:`ngra.training.ranks.from_rank_zero`: no other
rank reads the whole dataset), then every rank trains on its files as below; rank 0
writes the summary and removes the pairs, and a rank that fails names itself and ends
the run (:func:`ngra.training.ranks.named_failure`).

On a rank, :class:`LinkRankSession` runs one step an epoch:

1. the encoder embeds the rank's owned vertices (its layers exchange halos as for node
   classification);
2. the epoch's negatives whose destination the rank owns are drawn
   (:func:`~ngra.datasets.sample_negatives` with ``dst_owned``): the union over ranks is
   one process's set, in the input's ids, for any process count;
3. the embeddings of the sources the rank lacks among its pairs come from their owners
   through the halo exchange (:func:`~ngra.distributed.halo.exchange_rows` over a
   :class:`~ngra.distributed.halo.HaloPlan` built for the step's pairs: one
   ``all_to_all`` of counts and one of vertex ids; backward sends the gradients of those
   rows back to their owners);
4. the loss is each rank's binary cross-entropy sum over its pairs divided by the global
   number of pairs, so the gradients summed over the ranks are one process's.

Evaluation scores each rank's validation and test pairs the same way (their exchange
plan is built once) and gathers every score to every rank: ROC-AUC and Hits@K are then
computed from the same lists as one process (equal to float tolerance: the sums run in
another order), so every rank selects the same epoch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist

from ngra.datasets import degree_weights, sample_negatives
from ngra.datasets.linksplit import LinkSplit, negative_relations
from ngra.diskspace import atomic_output, write_file
from ngra.distributed.halo import HaloPlan, exchange_rows
from ngra.distributed.launch import in_worker, launch
from ngra.graph import Graph
from ngra.runtime.explain import explain
from ngra.training.config import TrainConfig
from ngra.training.link_task import LinkModel, link_metrics, make_decoder
from ngra.training.loop import fit_runs
from ngra.training.model_source import call_model
from ngra.training.ranks import (RankSession, from_rank_zero, named_failure, open_shard,
                                 prepare_shards, rank_shares, rank_threads, torchrun_group)
from ngra.training.resources import check_rank_data, local_ranks

__all__ = ["LinkRankSession", "link_files", "train_link_distributed", "write_link_pairs"]

log = logging.getLogger(__name__)

_PARTS = ("train_pos", "val_pos", "val_neg", "test_pos", "test_neg")
#: Each part's relations in a split by relation (DistMult).
_RELS = {"train_pos": "train_rel", "val_pos": "val_rel", "val_neg": "val_neg_rel",
         "test_pos": "test_rel", "test_neg": "test_neg_rel"}


def train_link_distributed(cfg: TrainConfig,
                           load: Callable[[], tuple[Any, LinkSplit, dict[str, Any]]],
                           meta: dict[str, Any], echo: Callable[[str], None] | None = None
                           ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    """Train link prediction over ``cfg.nprocs`` ranks (or, under ``torchrun``, as one of
    them). ``load()`` gives the prepared dataset, its split and the summary's facts about
    them, and fills ``meta`` (what checkpoints keep); it runs once, in the launching
    process or on torchrun's rank 0. Returns rank 0's ``(summary, selected weights,
    meta)`` (the weights ``None`` on other torchrun ranks)."""
    if in_worker():
        return _torchrun_rank(cfg, load, meta, echo)
    ds, split, info = load()
    with link_files(cfg, ds, split) as (folder, pairs):
        del ds
        results = launch(_rank_main, cfg.nprocs, cfg, str(folder), str(pairs), meta,
                         timeout_s=cfg.dist_timeout, threads=rank_threads(cfg))
    summary, state = results[0]
    return _finish(cfg, summary, info, echo), state, meta


def _torchrun_rank(cfg: TrainConfig, load: Callable[[], tuple[Any, LinkSplit, dict[str, Any]]],
                   meta: dict[str, Any], echo: Callable[[str], None] | None
                   ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    """One of torchrun's ranks: rank 0 loads, splits and writes the shards and pairs
    while the others wait; then every rank trains on its files."""
    rank, _ = torchrun_group(cfg)
    held = contextlib.ExitStack()  # rank 0's pairs folder, removed after training
    info: dict[str, Any] = {}

    def prepare() -> tuple[str, str, dict[str, Any]]:
        ds, split, facts = load()
        info.update(facts)
        # this host's ranks run already: their shares of the data against what is left
        folder, pairs = held.enter_context(link_files(cfg, ds, split, ranks=local_ranks(),
                                                      started=True))
        return str(folder), str(pairs), meta

    with held:
        folder, pairs, meta = from_rank_zero(prepare)
        with named_failure():
            summary, state = _rank_main(cfg, folder, pairs, meta)
        dist.destroy_process_group()
    if rank != 0:
        return summary, None, meta
    return _finish(cfg, summary, info, echo), state, meta


def _finish(cfg: TrainConfig, summary: dict[str, Any], info: dict[str, Any],
            echo: Callable[[str], None] | None) -> dict[str, Any]:
    """Rank 0's summary with the data's facts (``info``, less the loading process's
    memory: each rank reports its own), and the plans echoed (``--explain``)."""
    facts = {k: v for k, v in info.items() if k != "resident_mb"}
    for part in [summary, *(summary["results"] or [])]:
        part.update(facts, device=str(cfg.device))
    if echo is not None and cfg.explain and summary.get("explain"):
        echo(summary["explain"])
    return summary


@contextlib.contextmanager
def link_files(cfg: TrainConfig, ds: Any, split: LinkSplit,
               **check: Any) -> Iterator[tuple[Path, Path]]:
    """The message-passing graph's shards (cached) and the ranks' pairs (a temporary
    folder beside them, removed on exit) of ``split`` of the prepared dataset ``ds``,
    each rank's share of them checked against the memory (``check``: the
    :func:`~ngra.training.resources.check_rank_data` arguments of torchrun's ranks)."""
    spec = ds.info.get("spec") or ds.name
    tag = f"{spec}#link:val={cfg.val},test={cfg.test},seed={split.info.get('seed')}"
    message = replace(ds, graph=split.graph, edge_type=split.edge_type,
                      num_edge_types=split.num_relations, info={**ds.info, "spec": tag})
    folder = prepare_shards(cfg, message)
    with tempfile.TemporaryDirectory(prefix=".link-", dir=folder) as pairs:
        write_link_pairs(split, folder, Path(pairs), cfg.negatives)
        # each rank holds its shard, its pairs and the common arrays
        common = (Path(pairs) / "common.pt").stat().st_size
        check_rank_data([s._replace(bytes=s.bytes + common
                                    + (Path(pairs) / f"rank{r}.pt").stat().st_size)
                         for r, s in enumerate(rank_shares(folder))], cfg.allow_oversubscribe,
                        **check)
        yield folder, Path(pairs)


def write_link_pairs(split: LinkSplit, shards: Path, out: Path, negatives: str) -> None:
    """Each rank's pairs (book ids, by destination owner) and negatives' exclusions into
    ``out``, for the shards in ``shards`` (module docstring)."""
    meta = json.loads((shards / "meta.json").read_text())
    bounds = torch.tensor(meta["bounds"], dtype=torch.int64)
    k, n = bounds.numel() - 1, split.num_nodes
    order = torch.cat([torch.load(shards / f"rank{r}.pt", weights_only=True,
                                  mmap=True)["row_ids"].to(torch.int64) for r in range(k)])
    new_of = torch.empty(n, dtype=torch.int64)
    new_of[order] = torch.arange(n)
    common = {"new_of": new_of}
    if split.train_rel is not None:  # negative i takes training pair i mod E_train's
        common["train_rel"] = split.train_rel
    if negatives == "degree":
        common["degrees"] = torch.from_numpy(degree_weights(split.graph))
    with atomic_output(out / "common.pt", "the ranks' link pairs") as fh:
        torch.save(common, fh)
    ei = split.graph.edge_index()
    edge_owner = _owner(new_of[ei[1]], bounds)
    parts = {name: getattr(split, name) for name in _PARTS}
    for r in range(k):
        mine: dict[str, torch.Tensor] = {}
        for name, pairs in parts.items():
            p = new_of[pairs]
            keep = _owner(p[1], bounds) == r
            mine[name] = p[:, keep].contiguous()
            rel = getattr(split, _RELS[name])
            if rel is not None:
                mine[_RELS[name]] = rel[keep].contiguous()
        own_edges = Graph.from_edge_index(ei[:, edge_owner == r], num_nodes=n)
        mine["exclude_indptr"] = own_edges.indptr.clone()
        mine["exclude_indices"] = own_edges.indices.clone()
        with atomic_output(out / f"rank{r}.pt", "the ranks' link pairs") as fh:
            torch.save(mine, fh)
    info = {"num_nodes": n, "counts": {name: int(p.shape[1]) for name, p in parts.items()},
            "num_train_negatives": split.num_train_negatives(), "negatives": negatives,
            "num_relations": split.num_relations}
    write_file(out / "meta.json", json.dumps(info) + "\n", "the ranks' link pairs")


def _owner(ids: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """The rank owning each book id (rank ``r`` owns ``[bounds[r], bounds[r + 1])``)."""
    return torch.bucketize(ids, bounds[1:], right=True)


def _rank_main(cfg: TrainConfig, folder: str, pairs: str, meta: dict[str, Any]
               ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One rank's runs: its summary, and on rank 0 the selected weights."""
    shard, layout, groups = open_shard(cfg, Path(folder))
    files = Path(pairs)
    info = json.loads((files / "meta.json").read_text())
    mine = torch.load(files / f"rank{dist.get_rank()}.pt", weights_only=True)
    common = torch.load(files / "common.pt", weights_only=True, mmap=True)
    resolved = cfg.resolved()

    def session(seed: int) -> LinkRankSession:
        k = info["num_relations"]
        encoder = cfg.source.build(shard.meta["num_features"], cfg.embedding_dim,
                                   hyper=resolved, num_layers=resolved["num_layers"],
                                   num_edge_types=k)
        model = LinkModel(encoder, make_decoder(cfg.decoder, cfg.embedding_dim, k))
        return LinkRankSession(model, shard, mine, common, info, seed=seed,
                               budget=cfg.memory_budget, group=groups.gradients)

    summary, model = fit_runs(cfg, session, meta=meta)
    if dist.get_rank() != 0:
        return summary, None
    return summary, {k: v.detach().cpu() for k, v in model.state_dict().items()}


class LinkRankSession(RankSession):
    """One rank's share of a link-prediction run (module docstring)."""

    metric = "roc_auc"

    def __init__(self, model: LinkModel, shard: Any, pairs: dict[str, torch.Tensor],
                 common: dict[str, torch.Tensor], info: dict[str, Any], *, seed: int,
                 budget: str | None, group: Any = None) -> None:
        super().__init__(model, shard, budget, group)
        self.net = self.encoder = model.encoder
        self.pairs, self.info, self.seed = pairs, info, seed
        self.new_of = common["new_of"]
        self.degrees = common["degrees"].numpy() if "degrees" in common else None
        self.train_rel = common.get("train_rel")
        self.lo = int(shard.graph.bounds[self.rank])
        self.num_own = shard.graph.num_nodes
        n = info["num_nodes"]
        self.owned = np.zeros(n, dtype=bool)
        self.owned[shard.row_ids.numpy()] = True
        self.exclude = Graph(pairs["exclude_indptr"], pairs["exclude_indices"], None, n)
        self.train_count = info["counts"]["train_pos"]
        self.last_metrics = {}
        self._eval: tuple[HaloPlan, dict[str, torch.Tensor]] | None = None

    def capture_refusal(self) -> str | None:
        return "a link task trains in eager steps (no CUDA graph)"

    def batches(self, epoch: int) -> tuple[int]:
        return (epoch,)  # one full-graph step, its negatives drawn for this epoch

    def negatives(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This rank's share of epoch ``epoch``'s negatives, in book ids, and their
        relations (those of training pairs ``index mod E_train``; ``None`` untyped)."""
        neg, index = sample_negatives(self.info["num_nodes"], self.info["num_train_negatives"],
                                      self.seed, epoch=epoch, kind=self.info["negatives"],
                                      degrees=self.degrees, exclude=self.exclude,
                                      dst_owned=self.owned, return_index=True)
        return self.new_of[neg], negative_relations(self.train_rel, index)

    def loss(self, z: torch.Tensor, epoch: Any = 0) -> tuple[torch.Tensor, float]:
        pos, (neg, neg_rel) = self.pairs["train_pos"], self.negatives(int(epoch or 0))
        plan, local = self._fetch_plan({"pos": pos, "neg": neg})
        zz = exchange_rows(plan, [z])[0]
        dec = self.model.decoder
        local_sum = dec.bce_sum(zz, local["pos"], local["neg"], self.pairs.get("train_rel"),
                                neg_rel)
        counts = self._sum(torch.tensor([float(local_sum.detach()), float(neg.shape[1])],
                                        dtype=torch.float64)).tolist()
        total = max(self.train_count + counts[1], 1.0)
        return local_sum / total, counts[0] / total

    @torch.no_grad()
    def evaluate(self) -> tuple[dict[str, float], float]:
        self.model.eval()
        with self.context():
            z = call_model(self.net, self.graph, self.x, self.edge_data)
        if self._eval is None:
            self._eval = self._fetch_plan({k: self.pairs[k] for k in _PARTS[1:]})
        plan, local = self._eval
        zz = exchange_rows(plan, [z])[0]
        dec = self.model.decoder
        scores = {k: self._gather(dec(zz, v, self.pairs.get(_RELS[k])))
                  for k, v in local.items()}
        return link_metrics({part: (scores[f"{part}_pos"], scores[f"{part}_neg"])
                             for part in ("val", "test")}, self.last_metrics)

    def explain(self) -> str:
        with self.context():
            return explain(self.net, self.graph, self.x, self.edge_data)

    # -------------------------------------------------------------- exchange
    def _fetch_plan(self, parts: dict[str, torch.Tensor]
                    ) -> tuple[HaloPlan, dict[str, torch.Tensor]]:
        """A halo plan bringing every source of ``parts`` (``[2, M]`` book ids, each
        destination owned here) this rank lacks, and the pairs in local rows: owned
        vertices ``[0, D)``, then the fetched ones."""
        d, lo, k = self.num_own, self.lo, self.world
        bounds = self.graph.bounds.to(torch.int64)
        srcs = torch.cat([p[0] for p in parts.values()]) if parts else torch.empty(0)
        remote = srcs[(srcs < lo) | (srcs >= lo + d)]
        need = torch.unique(remote)  # sorted: grouped by owner, as the exchange wants
        recv_counts = torch.bincount(_owner(need, bounds), minlength=k)
        send_counts = torch.empty_like(recv_counts)
        dist.all_to_all_single(send_counts, recv_counts, group=self.graph.group)
        asked = need.new_empty(int(send_counts.sum()))
        dist.all_to_all_single(asked, need, output_split_sizes=send_counts.tolist(),
                               input_split_sizes=recv_counts.tolist(), group=self.graph.group)
        plan = HaloPlan(d, int(need.numel()), asked - lo, send_counts.tolist(),
                        recv_counts.tolist(), self.graph.group, self.graph.traffic)
        local = {}
        for name, p in parts.items():
            s = p[0]
            mine = (s >= lo) & (s < lo + d)
            ls = torch.where(mine, s - lo, d + torch.searchsorted(need, s))
            local[name] = torch.stack([ls, p[1] - lo])
        return plan, local

    def _gather(self, scores: torch.Tensor) -> torch.Tensor:
        """Every rank's ``scores`` concatenated by rank, on every rank."""
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([scores.numel()]), group=self.graph.group)
        top = max(int(s) for s in sizes)
        padded = scores.new_zeros(top)
        padded[:scores.numel()] = scores
        out = [scores.new_empty(top) for _ in range(self.world)]
        dist.all_gather(out, padded, group=self.graph.group)
        return torch.cat([o[:int(s)] for o, s in zip(out, sizes)])

