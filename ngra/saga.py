"""The SAGA-NN programming model: Scatter, ApplyEdge, Gather, ApplyVertex.

A GNN layer is a :class:`SagaLayer` subclass with two ordinary methods and a
Gather accumulator name::

    class GCN(ngra.SagaLayer):
        gather = "sum"
        def __init__(self, f_in, f_out):
            super().__init__()
            self.lin = nn.Linear(f_in, f_out)
        def apply_edge(self, edge):          # edge.src, edge.dst: vertex rows per edge
            return edge.src * edge.data      # edge.data: per-edge tensor (or None)
        def apply_vertex(self, vertex, acc):  # vertex: layer input rows; acc: gathered [N, ...]
            return self.lin(acc)

    out = GCN(16, 8)(graph, x)               # [num_nodes, 8]

Scatter is implied by what ``apply_edge`` reads (``edge.src`` / ``edge.dst``).
Gather reduces ``apply_edge``'s result over each destination's in-edges with
``sum``, ``mean``, ``max``, ``min`` or ``softmax``; for ``softmax``, ``apply_edge``
returns ``(score, value)`` and the values are summed with weights
``softmax(score)`` over the in-edges (GAT). Destinations with no in-edges get
the accumulator's identity, 0. Vertex and edge data may be tensors or dicts of
named tensors.

When ``apply_edge`` returns a dict, ``gather`` may name a reducer per field
(``sum``, ``mean``, ``max`` or ``min``; ``softmax`` does not mix with others), and
``acc`` is the dict of the fields' reductions. PNA's aggregators from one message::

    class PNAAggregate(ngra.SagaLayer):
        gather = {"mean": "mean", "sq": "mean", "hi": "max", "lo": "min"}
        def apply_edge(self, edge):
            h = self.pre(torch.cat([edge.dst, edge.src], -1))
            return {"mean": h, "sq": h * h, "hi": h, "lo": h}

Fields that the compiler fuses run as one kernel that walks each destination's
in-edges once for all of them (``ngra.explain`` names it).

A ``softmax`` layer may drop its normalized weights in training mode (attention
dropout, as in the GAT paper and PyG's ``GATConv(dropout=p)``) by setting
``attention_dropout`` beside ``gather``, on the class or the instance::

    class GAT(ngra.SagaLayer):
        gather = "softmax"
        attention_dropout = 0.6              # or self.attention_dropout = p in __init__

How a call ``layer(graph, x, edge_data, dropout=p)`` runs: the executor
(:mod:`ngra.runtime.executor`) validates the inputs and puts edge data in CSC order; the
compiler (:mod:`ngra.compiler`) traces ``apply_edge``/``apply_vertex`` once per input
signature and runs its passes (one a file, assembled in :mod:`ngra.compiler.pipeline`):
it splits a linear over ``cat([...])`` into per-block linears, hoists source-only and
destination-only work to the vertex side, sinks a linear that ends ApplyEdge past a
sum/mean gather, reorders a leading linear of ApplyVertex when that shrinks the
propagated width (also over GIN's self term), contracts vertex-side ``(x * w).sum(-1)``
with a row-independent ``w`` (GAT's scores) into ``rowdot``, and matches the edge stage
to a fused kernel, else runs the UDFs as written (the generic plan). A softmax whose
scores are rowdots of its own value (GAT) runs as ``attention_aggregate``, which keeps
nothing ``N x H x D`` between forward and backward. Attention dropout hashes its masks
from two seeds drawn per call and each edge's id in the whole graph, so every kernel,
tile and rank draws the same masks. The executor then runs the plan's vertex-side
``pre`` stage (the input dropout inside the Linears that read ``x``, where those are its
only reads), walks the grid column by column (each tile's source rows staged, its edge
stage merged into the column's accumulator) and runs ``post`` (ApplyVertex). The whole
graph is the 1 x 1 grid; under :func:`ngra.memory_budget` the smallest grid whose
measured per-tile working set fits is chosen (:mod:`ngra.runtime.budget`), and backward
differentiates one tile at a time, so edge memory is O(tile).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ngra.compiler.gather import GATHERS, check_gather
from ngra.edge import Edge
from ngra.runtime.executor import execute

__all__ = ["SagaLayer", "Edge", "GATHERS", "check_gather"]
class SagaLayer(nn.Module):
    """Base class of a GNN layer written as a SAGA-NN vertex program.

    Subclasses set ``gather`` and override ``apply_edge(self, edge)`` and/or
    ``apply_vertex(self, vertex, acc)``. The defaults copy the source row
    (``edge.src``) and return the accumulator unchanged.

    With ``gather = "softmax"``, ``attention_dropout = p`` (class or instance
    attribute, in ``[0, 1)``; default 0) drops the normalized weights in training
    mode: each weight of each edge and score head is zeroed with probability ``p``
    and the others scaled by ``1 / (1 - p)``, after the softmax, so a destination's
    weights no longer sum to 1 (PyG's ``GATConv(dropout=p)``, DGL's ``attn_drop``).
    The fused kernels draw the masks inside (a counter-based hash of each edge's
    original id: no ``[E, H]`` mask is stored, and a memory budget's tiles draw
    the same masks). Eval mode applies nothing.

    Calling the layer, ``layer(graph, x, edge_data=None)``:

    Args:
        graph: an :class:`ngra.Graph` with ``N`` vertices and ``E`` edges.
        x: vertex data, ``[N, ...]`` or a dict of such tensors.
        edge_data: per-edge data ``[E, ...]`` (or dict) in the graph's original
            edge order (default: the graph's edge weights, or ``None``).
        dropout: input dropout probability, applied to ``x`` in training mode
            (:func:`ngra.kernels.dropout`). Where every read of ``x`` is a Linear
            of the vertex-side stage (GCN, GAT), the compiled plan applies it inside
            those Linears and no dropped copy of ``x`` is kept (default: 0).

    Returns:
        ``apply_vertex``'s result, ``[N, ...]`` (or a dict of such tensors): one row per
        vertex, else a ``ValueError`` names the layer and the shape that arrived.
    """

    gather: str | dict[str, str] = "sum"
    attention_dropout: float = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_gather(cls.gather, cls.__name__)
        p = cls.attention_dropout
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
            raise TypeError(f"{cls.__name__}.attention_dropout must be a probability in "
                            f"[0, 1); got {p!r}.")
        if p and cls.gather != "softmax":
            raise TypeError(f"{cls.__name__}.attention_dropout drops the weights of a softmax "
                            f"gather; its gather is {cls.gather!r}.")
        _check_signature(cls, "apply_edge", ("edge",))
        _check_signature(cls, "apply_vertex", ("vertex", "acc"))

    def apply_edge(self, edge: Edge) -> Any:
        return edge.src

    def apply_vertex(self, vertex: Any, acc: torch.Tensor) -> Any:
        return acc

    def forward(self, graph: Any, x: Any, edge_data: Any = None, dropout: float = 0.0,
                activation: Any = None) -> Any:
        return execute(self, graph, x, edge_data, dropout, activation)


def _check_signature(cls: type, name: str, expected: tuple[str, ...]) -> None:
    """Check that ``layer.<name>(*expected)`` is a call Python accepts, at class definition.

    The check looks at what an instance call binds to (the descriptor protocol): a
    method of any instance-parameter name, a ``staticmethod``/``classmethod``, or a
    plain callable assigned on the class. Definitions inherited from an earlier
    SagaLayer subclass were checked with it.
    """
    owner = next(k for k in cls.__mro__ if name in k.__dict__)
    if owner is not cls and issubclass(owner, SagaLayer):
        return
    attr = owner.__dict__[name]
    if not callable(attr) and not hasattr(type(attr), "__get__"):
        raise TypeError(f"{cls.__name__}.{name} must be a method; got {type(attr).__name__}.")
    try:
        bound = attr.__get__(object.__new__(cls), cls) if hasattr(type(attr), "__get__") else attr
        sig = inspect.signature(bound)
    except (TypeError, ValueError, AttributeError):
        return  # a descriptor or builtin Python cannot introspect: the first call will tell
    if not callable(bound):
        raise TypeError(f"{cls.__name__}.{name} must be a method; got {type(attr).__name__}.")
    problem = _binding_problem(sig, len(expected))
    if problem:
        want = ", ".join(expected)
        got = ", ".join(str(p) for p in sig.parameters.values()) or "no parameters"
        raise TypeError(
            f"{cls.__name__}.{name} must take ({want}) when called on a layer; it takes "
            f"({got}): {problem}. Define it as `def {name}(self, {want}):`."
        )


def _binding_problem(sig: inspect.Signature, n: int) -> str | None:
    """Why ``sig`` cannot be called with ``n`` positional arguments (``None``: it can)."""
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) > n:
        extra = ", ".join(p.name for p in required[n:])
        return f"{len(required)} required positional parameters, {n} are passed ({extra} unfilled)"
    if len(positional) < n and not any(p.kind == p.VAR_POSITIONAL for p in params):
        return f"it accepts {len(positional)} positional arguments, {n} are passed"
    kw_only = [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    if kw_only:
        return f"keyword-only parameter(s) {', '.join(kw_only)} have no default"
    return None
