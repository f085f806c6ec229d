"""Labeled graph cases shared by the test packages, each built from an explicit seed.

Kernel cases are functions ``(gen) -> (src, dst, num_src, num_dst)`` of a
``torch.Generator``; :func:`graph_case` turns one into the CSC form the kernels take::

    indptr, indices, num_src = graph_case("hub", gen, index_dtype=torch.int32)

``indptr`` is int64 ``[num_dst + 1]``, ``indices`` the source of each edge in
destination-sorted order with the requested dtype.

Square cases (:data:`SQUARE_CASES`, vertex-to-vertex :class:`ngra.Graph` s of ``n``
vertices, as the compiler tests take them) come from :func:`square_graph`.

Seeds: :func:`case_generator` derives a case's seed from its labels (case name, size)
and the session's base seed, ``$NGRA_TEST_SEED`` or a fresh one per session, so every
run draws new graphs and a failure replays: the case prints its seed and the
``NGRA_TEST_SEED`` that reproduces it (pytest shows a failing test's output).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable

import torch

from ngra import Graph

__all__ = ["BASE_SEED", "CASES", "SMALL_CASES", "SQUARE_CASES", "case_generator", "case_seed",
           "graph_case", "square_graph", "to_csc"]

# Drawn once per session unless given, so that one NGRA_TEST_SEED replays every case of a run.
BASE_SEED = int(os.environ.get("NGRA_TEST_SEED") or secrets.randbits(31))


def case_seed(*labels: object) -> int:
    """A 31-bit seed derived from :data:`BASE_SEED` and ``labels`` (stable across runs)."""
    key = repr((BASE_SEED, *labels)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 33


def case_generator(*labels: object) -> torch.Generator:
    """A ``torch.Generator`` seeded with :func:`case_seed` of ``labels``; prints how to replay it."""
    seed = case_seed(*labels)
    print(f"graph case {labels}: seed {seed}; rerun with NGRA_TEST_SEED={BASE_SEED}")
    return torch.Generator().manual_seed(seed)


Edges = tuple[torch.Tensor, torch.Tensor, int, int]


def to_csc(src: torch.Tensor, dst: torch.Tensor, num_dst: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Destination-sorted CSC (stable: multi-edges keep their input order)."""
    perm = torch.argsort(dst, stable=True)
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst, minlength=num_dst), 0, out=indptr[1:])
    return indptr, src[perm].contiguous()


def _randint(gen: torch.Generator, high: int, n: int) -> torch.Tensor:
    return torch.randint(0, high, (n,), generator=gen)


def _empty(gen: torch.Generator) -> Edges:
    e = torch.empty(0, dtype=torch.int64)
    return e, e, 3, 4


def _empty_no_dst(gen: torch.Generator) -> Edges:
    e = torch.empty(0, dtype=torch.int64)
    return e, e, 2, 0


def _random(gen: torch.Generator) -> Edges:
    return _randint(gen, 12, 40), _randint(gen, 10, 40), 12, 10


def _isolated(gen: torch.Generator) -> Edges:
    # Only even destinations and sources below 6 take part: odd destinations have
    # no in-edges, sources >= 6 no out-edges.
    return _randint(gen, 6, 25), 2 * _randint(gen, 6, 25), 11, 12


def _self_loops(gen: torch.Generator) -> Edges:
    n = 9
    loops = torch.arange(n)
    src, dst = _randint(gen, n, 15), _randint(gen, n, 15)
    return torch.cat([loops, src, loops]), torch.cat([loops, dst, loops]), n, n


def _multi_edges(gen: torch.Generator) -> Edges:
    src, dst = _randint(gen, 5, 8), _randint(gen, 5, 8)
    return src.repeat(3), dst.repeat(3), 5, 5


def _skewed(gen: torch.Generator) -> Edges:
    # In-degrees ~ 1/rank: a few heavy destinations, a long tail of light ones.
    n = 40
    weights = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
    dst = torch.multinomial(weights, 300, replacement=True, generator=gen)
    return _randint(gen, n, 300), dst, n, n


def _hub(gen: torch.Generator) -> Edges:
    # One destination with 10^5 in-edges among a few light ones.
    hub = 100_000
    src = torch.cat([_randint(gen, 1000, hub), _randint(gen, 1000, 50)])
    dst = torch.cat([torch.full((hub,), 3), _randint(gen, 8, 50)])
    return src, dst, 1000, 8


def _bipartite_wide(gen: torch.Generator) -> Edges:
    return _randint(gen, 30, 45), _randint(gen, 7, 45), 30, 7


def _bipartite_narrow(gen: torch.Generator) -> Edges:
    return _randint(gen, 4, 30), _randint(gen, 20, 30), 4, 20


CASES: dict[str, Callable[[torch.Generator], Edges]] = {
    "empty": _empty,
    "empty_no_dst": _empty_no_dst,
    "random": _random,
    "isolated": _isolated,
    "self_loops": _self_loops,
    "multi_edges": _multi_edges,
    "skewed": _skewed,
    "hub": _hub,
    "bipartite_wide": _bipartite_wide,
    "bipartite_narrow": _bipartite_narrow,
}
# Cases cheap enough for numerical gradient checks.
SMALL_CASES = [name for name in CASES if name not in ("hub", "skewed")]


def graph_case(
    name: str, gen: torch.Generator | None = None, index_dtype: torch.dtype = torch.int64
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(indptr [num_dst + 1] int64, indices [E] index_dtype, num_src)`` of case ``name``."""
    gen = gen if gen is not None else case_generator(name)
    src, dst, num_src, num_dst = CASES[name](gen)
    indptr, indices = to_csc(src, dst, num_dst)
    return indptr, indices.to(index_dtype), num_src


# ------------------------------------------------------------------------- square cases
SQUARE_CASES = ("random", "empty", "isolated", "self_loops", "multi_edges", "skewed")


def square_graph(case: str, n: int, gen: torch.Generator) -> Graph:
    """Labeled square case ``case`` (one of :data:`SQUARE_CASES`) with ``n`` vertices."""

    def randint(high: int, size: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(0, high, size, generator=gen)

    if case == "random":
        ei = randint(n, (2, 4 * n))
    elif case == "empty":
        ei = torch.empty(2, 0, dtype=torch.int64)
    elif case == "isolated":  # the upper half of the vertices has no edges at all
        ei = randint(n // 2, (2, 3 * n))
    elif case == "self_loops":
        ei = torch.cat([randint(n, (2, 2 * n)), torch.arange(n).repeat(2, 1)], 1)
    elif case == "multi_edges":
        base = randint(n, (2, n))
        ei = torch.cat([base, base, base[:, :3]], 1)
    elif case == "skewed":  # a hub with in-degree ~3n, a few other edges
        hub = torch.stack([randint(n, (3 * n,)), torch.zeros(3 * n, dtype=torch.int64)])
        ei = torch.cat([hub, randint(n, (2, n))], 1)
    else:
        raise ValueError(f"unknown square case {case!r}; expected one of {SQUARE_CASES}")
    return Graph.from_edge_index(ei, num_nodes=n)
