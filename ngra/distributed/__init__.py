"""ngra.distributed: full-graph training over several processes (torch.distributed).

``ngra train --nprocs K`` (:mod:`ngra.training.ranks`) is the whole path. Its
pieces, for a user's own model and loop:

* :func:`launch` starts ``K`` ranks (gloo on the CPU, NCCL with one GPU a rank) and names
  the rank that failed (:class:`DistributedError`);
* :func:`ngra.partition.build_book` partitions a graph, :func:`build_shards` writes each
  rank's share of a dataset, and :func:`load_shard` gives a rank its :class:`DistGraph`,
  rows and labels: any :class:`ngra.SagaLayer` runs on a ``DistGraph`` unchanged;
* :class:`GradientSync` sums gradients over the ranks while backward runs;
* :func:`link_model` / :func:`calibrate`: the link's alpha-beta costs, measured once per
  machine, which choose each layer's exchange (:mod:`ngra.distributed.cost`): a halo
  (:mod:`~ngra.distributed.halo`, :mod:`~ngra.distributed.overlap`), the ring
  (:mod:`~ngra.distributed.ring`) or feature columns (:mod:`~ngra.distributed.feature`).
"""

from ngra.distributed.gradsync import GradientSync
from ngra.distributed.graph import DistGraph
from ngra.distributed.launch import DistributedError, in_worker, launch
from ngra.distributed.link import AlphaBeta, LinkModel, calibrate, link_model
from ngra.distributed.shards import Shard, build_shards, load_shard

__all__ = ["AlphaBeta", "DistGraph", "DistributedError", "GradientSync", "LinkModel", "Shard",
           "build_shards", "calibrate", "in_worker", "launch", "link_model", "load_shard"]
