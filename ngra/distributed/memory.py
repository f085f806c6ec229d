"""What one rank's partition requires in memory, counted from the partition book's figures.

Issue 41's memory target compares a rank's peak above its fixed cost (interpreter,
libraries, allocator, compiled kernels: what the rank holds on an empty partition) with
what its partition itself requires. :func:`partition_bytes` counts the latter for rank
``r`` of a partition (:class:`~ngra.distributed.cost.PartitionStats`: its ``D`` owned
rows, the ``H`` halo rows it receives, the ``S`` rows it sends and its ``E`` in-edges)
and the layers the plan runs (:class:`LayerWidths`), array by array, at the dtypes the
shards and the runtime use (indices and offsets 32-bit while they fit, ids 64-bit,
values 4 bytes):

* ``data``: the owned rows' features ``D F``, labels and original ids (8 bytes each) and
  the three split masks (1 byte each);
* ``structure``: the local CSC over ``D + H`` rows (offsets, sources, each edge's id),
  its weights (GCN's factored weights: a source and a destination factor a local row;
  else a weight an edge where the model has one) and per-edge data, the halo ids
  (``H``) and the rows to send (``S``);
* ``split``: with the overlapped halo, the inner and boundary tiles (offsets over ``D``
  each, sources and CSC positions of every edge) and each tile's reverse for backward
  (offsets over ``D + 1`` and ``H + 1`` rows, destinations and positions of every edge);
* ``activations``: what each layer keeps for backward: its input rows ``D a``, the
  propagated terms of its owned and halo rows ``(D + H) p`` and its output rows ``D b``
  (``a``, ``b`` the layer's input and output widths, ``p`` the bytes of a propagated
  row); with ``--halo-staleness 1`` also the previous step's halo rows and returned
  gradients ``(H + S) p`` a layer;
* ``backward``: the gradients of the widest layer's kept arrays (backward holds one
  layer's at a time; none of the first layer's input, the features) and the exchange's
  packed rows ``2 S p`` (forward and reverse);
* ``loss``: the training rows' logits and their log-softmax (``2 D C`` at most);
* ``parameters``: the weights, their gradients and Adam's two moments (``4 P``).

What is not counted is the fixed cost, and what a layout other than the halo exchange
holds (the ring's chunks, the feature layout's whole structure): the count is the halo
layout's. The benchmark (``experiments/distributed_bench.py --memory``) compares the
count with each rank's peak above its fixed cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ngra.distributed.cost import PartitionStats

__all__ = ["LayerWidths", "partition_bytes"]

#: Bytes of a value (features, activations, weights: float32).
VALUE = 4


@dataclass(frozen=True)
class LayerWidths:
    """One layer as the count sees it: input width ``a``, bytes of a propagated source
    row ``p`` (the exchange's ``row_bytes``) and output width ``b``."""

    in_width: int
    row_bytes: int
    out_width: int


def _index(n: int) -> int:
    """Bytes of an index or offset into ``n`` items (32-bit while it fits)."""
    return 4 if n < 2**31 else 8


def partition_bytes(stats: PartitionStats, rank: int, *, features: int, classes: int,
                    layers: Sequence[LayerWidths], params: int = 0, factors: bool = True,
                    edge_weight: bool = False, edge_data_bytes: int = 0,
                    overlap: bool = True, staleness: int = 0) -> dict[str, int]:
    """Bytes rank ``rank``'s partition requires, by part (the module docs), and their
    ``total``.

    Args:
        stats: the partition's figures (the shards' ``meta.json`` ``stats``).
        rank: the rank.
        features, classes: the feature width ``F`` and the class count ``C``.
        layers: the plan's layers in the order they run.
        params: the model's parameter count ``P``.
        factors: the edge weights are factored (a source and a destination factor a row).
        edge_weight: the shard holds a weight an edge.
        edge_data_bytes: bytes of the model's edge data an edge.
        overlap: the halo exchange overlaps (the split's tiles are kept).
        staleness: 1 when a layer keeps the previous step's halo rows and gradients.
    """
    if not 0 <= rank < stats.world_size:
        raise ValueError(f"rank must be in [0, {stats.world_size}); got {rank}.")
    d, h, s = int(stats.rows[rank]), int(stats.received[rank]), int(stats.sent[rank])
    e = int(sum(stats.edges[rank]))
    n_local = d + h
    edge_index = _index(e)
    data = d * features * VALUE + d * 8 + d * 8 + 3 * d
    structure = ((n_local + 1) * edge_index + e * _index(n_local) + e * _index(stats.num_edges)
                 + (2 * n_local * VALUE if factors else 0) + (e * VALUE if edge_weight else 0)
                 + e * edge_data_bytes + h * 8 + s * 8)
    split = 0
    if overlap:
        split = ((2 * (d + 1) + (d + 1) + (h + 1)) * edge_index  # tiles' and reverses' offsets
                 + 4 * e * edge_index)  # each edge: source, position; reverse: dst, position
    kept = [d * lay.in_width * VALUE + n_local * lay.row_bytes + d * lay.out_width * VALUE
            for lay in layers]
    activations = sum(kept) + (sum((h + s) * lay.row_bytes for lay in layers)
                               if staleness else 0)
    # the first layer's input is the features: no gradient of it is made
    grads = [k - (d * lay.in_width * VALUE if i == 0 else 0)
             for i, (k, lay) in enumerate(zip(kept, layers))]
    backward = (max(grads, default=0)
                + 2 * s * max((lay.row_bytes for lay in layers), default=0))
    out = {"data": data, "structure": structure, "split": split, "activations": activations,
           "backward": backward, "loss": 2 * d * classes * VALUE,
           "parameters": 4 * int(params) * VALUE}
    out["total"] = sum(out.values())
    return out
