"""Which SAGA stage a piece of measured time belongs to.

Two sources of time, one vocabulary (:data:`STAGES` plus :data:`REMAINDER`):

**ngra** is timed by its own probes (:mod:`ngra.probes`). Probe names
map to stages with :data:`PROBE_STAGES`:

==============  ============  ===============================================
probe           stage         why
==============  ============  ===============================================
``scatter``     Scatter       the per-edge row gathers of ``edge.src/dst``
``apply_edge``  ApplyEdge     the UDF on a tile's edges (gathers excluded)
``pre``         ApplyEdge     a compiled plan's hoisted per-vertex edge terms;
                              ApplyVertex when the compiler only moved a
                              transform before propagation (GCN's, SAGE's
                              ``lin``; see ``measure.plan_info``)
``gather``      Gather        ``accumulator.partial`` (segment reductions)
``combine``     Gather        merging tile partials
``finalize``    Gather        mean division / softmax normalization
``edge``        Gather        a *fused* plan's one-pass edge kernel (labelled
                              fused); in the generic plan only glue remains
                              here and it is left in the remainder
``post``        ApplyVertex   ``apply_vertex``
==============  ============  ===============================================

**PyG and DGL** are timed with ``torch.profiler``. Each GNN layer call runs
inside a ``record_function(LAYER_RANGE)`` range; the ops directly inside it
(top-level ops; nested aten calls count in their parent) are classified by
:func:`classify_layer_ops`:

1. *Sparse ops* by name. Scatter: ``index_select``, ``index``, ``gather``,
   ``embedding``, ``take`` (row gathers). Gather: ``scatter_add(_)``,
   ``scatter_reduce(_)``, ``index_add(_)``, ``scatter(_)``, segment
   reductions, sparse matmuls, DGL's ``GSpMM`` and ``EdgeSoftmax``. DGL's
   ``GSDDMM`` (a per-edge op on gathered endpoints: Scatter and ApplyEdge in one
   kernel) is ApplyEdge.
2. *Phase* by position: *pre* = ops before the layer's first sparse op,
   *edge* = from there to its last Gather op, *post* = after it.
3. Non-sparse ops: in the edge phase, ApplyEdge (per-edge math: ``mul``,
   ``add``, ``leaky_relu``, ``exp``, ``sub``, ``div`` of PyG's softmax, DGL's
   per-type ``matmul`` ...). In the post phase, ApplyVertex (update linears,
   bias, GRU). In the pre phase, element-wise ops are ApplyEdge (per-vertex
   terms the edges will read: DGL's ``el = (feat * attn_l).sum(-1)``, PyG's
   ``alpha_src``) and linears (:data:`LINEAR_OPS`) go to the model's
   ``pre_linear`` stage, because the same ``x @ W`` means different things:
   GCN/SAGE's transform-before-propagate is ApplyVertex moved forward, while
   GAT's projection, GG-NN's ``A_t h`` and R-GCN's ``W_r h`` are ApplyEdge
   hoisted to the vertices (:data:`MODEL_RULES`). ``post_linear_head`` lists
   stages for the first linears of the post phase where a framework applies an
   edge-side transform after its last aggregation (PyG's R-GCN multiplies each
   relation's aggregate by ``W_r`` after propagating it).
4. Structure ops (:data:`STRUCTURE_OPS`: sorting edges by type, masks,
   ``nonzero``, ``.item()``) are left in the remainder.

Backward ops are attributed through autograd sequence numbers: the backward
node ``XBackward`` of a forward op carries that op's sequence number, so it
inherits the stage of the top-level forward op that created it (the last
forward op with that number). Backward nodes of ops outside layers (loss,
activations between layers, heads) stay in the remainder.

Everything not attributed (Python and framework overhead between ops,
ops outside layer ranges, structure ops, profiler overhead) is the
``remainder`` row: ``run total - sum of stages``, reported, never hidden.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "STAGES", "REMAINDER", "PROBE_STAGES", "LAYER_RANGE", "MODEL_RULES", "ModelRule",
    "op_class", "classify_layer_ops", "probe_stage",
]

STAGES = ("Scatter", "ApplyEdge", "Gather", "ApplyVertex")
REMAINDER = "remainder"

LAYER_RANGE = "ngra.characterize.layer"

PROBE_STAGES: dict[str, str] = {
    "scatter": "Scatter",
    "apply_edge": "ApplyEdge",
    "pre": "ApplyEdge",
    "gather": "Gather",
    "combine": "Gather",
    "finalize": "Gather",
    "post": "ApplyVertex",
}

SCATTER_OPS = frozenset({
    "aten::index_select", "aten::index", "aten::gather", "aten::embedding", "aten::take",
})
GATHER_OPS = frozenset({
    "aten::scatter_add_", "aten::scatter_add", "aten::scatter_reduce_", "aten::scatter_reduce",
    "aten::index_add_", "aten::index_add", "aten::scatter_", "aten::scatter",
    "aten::segment_reduce", "aten::_segment_reduce", "aten::_sparse_mm", "aten::sparse_mm",
    "aten::_sparse_addmm", "aten::_sparse_csr_mm", "aten::spmm",
    "GSpMM", "GSpMM_hetero", "EdgeSoftmax", "EdgeSoftmax_hetero", "SegmentReduce",
    "ScatterAdd", "CSRMM", "CSRSum",
})
EDGE_FUSED_OPS = frozenset({"GSDDMM", "GSDDMM_hetero"})
LINEAR_OPS = frozenset({
    "aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm", "aten::baddbmm",
    "aten::einsum", "aten::gru_cell", "aten::lstm_cell", "aten::_addmm_activation",
    "GATHERMM", "SEGMENTMM", "aten::segment_matmul", "pyg::segment_matmul",
})
STRUCTURE_OPS = frozenset({
    "aten::sort", "aten::argsort", "aten::nonzero", "aten::unique", "aten::_unique2",
    "aten::searchsorted", "aten::bincount", "aten::item", "aten::is_nonzero",
    "aten::_local_scalar_dense", "aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt",
    "aten::ge", "aten::min", "aten::max", "aten::any", "aten::all", "aten::arange",
    "aten::lift_fresh", "aten::detach_", "aten::to", "aten::_to_copy",
})


@dataclass(frozen=True)
class ModelRule:
    """How a model's linears map to stages (see the module docstring).

    Attributes:
        pre_linear: stage of linears before the layer's first sparse op.
        edge_linear: stage of linears inside the edge phase.
        post_linear_head: stages of the first linears of the post phase.
    """

    pre_linear: str = "ApplyVertex"
    edge_linear: str = "ApplyEdge"
    post_linear_head: tuple[str, ...] = ()


MODEL_RULES: dict[tuple[str, str], ModelRule] = {
    ("*", "gcn"): ModelRule(pre_linear="ApplyVertex"),
    ("*", "sage"): ModelRule(pre_linear="ApplyVertex"),
    ("*", "gin"): ModelRule(pre_linear="ApplyVertex"),
    ("*", "gat"): ModelRule(pre_linear="ApplyEdge"),
    ("*", "ggnn"): ModelRule(pre_linear="ApplyEdge"),
    ("*", "rgcn"): ModelRule(pre_linear="ApplyEdge"),
    ("pyg", "rgcn"): ModelRule(pre_linear="ApplyEdge", post_linear_head=("ApplyEdge",)),
}


def model_rule(framework: str, model: str) -> ModelRule:
    return MODEL_RULES.get((framework, model)) or MODEL_RULES.get(("*", model)) or ModelRule()


def op_class(name: str) -> str:
    """``scatter``, ``gather``, ``edge_fused``, ``linear``, ``structure`` or ``other``."""
    if name in SCATTER_OPS:
        return "scatter"
    if name in GATHER_OPS or name.startswith(("torch_scatter::", "pyg::segment", "pyg::sampled")):
        return "gather"
    if name in EDGE_FUSED_OPS:
        return "edge_fused"
    if name in LINEAR_OPS:
        return "linear"
    if name in STRUCTURE_OPS:
        return "structure"
    return "other"


def _is_edge_index(shapes: Any, num_edges: int | None) -> bool:
    """``aten::index`` on a ``[2, E]`` edge index (masking edges by type) is structure."""
    if not shapes or num_edges is None:
        return False
    first = shapes[0]
    return len(first) == 2 and first[0] == 2 and first[1] == num_edges


def classify_layer_ops(ops: Sequence[tuple[str, Any]], rule: ModelRule,
                       num_edges: int | None = None) -> list[str | None]:
    """Stage of each top-level op of one layer call, in call order.

    Args:
        ops: ``(name, input_shapes)`` per op, in call order.
        rule: the model's linear rule.
        num_edges: the graph's edge count (to recognise edge-index masking).
    Returns:
        one of :data:`STAGES` per op, or ``None`` (left in the remainder).
    """
    classes = []
    for name, shapes in ops:
        c = op_class(name)
        if c == "scatter" and name == "aten::index" and _is_edge_index(shapes, num_edges):
            c = "structure"
        classes.append(c)
    sparse = [i for i, c in enumerate(classes) if c in ("scatter", "gather", "edge_fused")]
    gathers = [i for i, c in enumerate(classes) if c == "gather"]
    first = sparse[0] if sparse else len(classes)
    last = gathers[-1] if gathers else (sparse[-1] if sparse else -1)
    out: list[str | None] = []
    post_linears = 0
    for i, c in enumerate(classes):
        if c == "structure":
            out.append(None)
        elif c == "scatter":
            out.append("Scatter")
        elif c == "gather":
            out.append("Gather")
        elif c == "edge_fused":
            out.append("ApplyEdge")
        elif i < first:
            out.append(rule.pre_linear if c == "linear" else "ApplyEdge")
        elif i <= last:
            out.append(rule.edge_linear if c == "linear" else "ApplyEdge")
        elif c == "linear":
            head = rule.post_linear_head
            out.append(head[post_linears] if post_linears < len(head) else "ApplyVertex")
            post_linears += 1
        else:
            out.append("ApplyVertex")
    return out


def probe_stage(name: str | None, fused: bool) -> str | None:
    """The SAGA stage of ngra probe ``name`` (``None``: remainder)."""
    if name is None:
        return None
    if name == "edge":
        return "Gather" if fused else None
    return PROBE_STAGES.get(name)


def sum_by_stage(pairs: Iterable[tuple[str | None, float]]) -> dict[str, float]:
    """Sum ``(stage, seconds)`` pairs into a dict over :data:`STAGES` (``None`` dropped)."""
    out = {s: 0.0 for s in STAGES}
    for s, t in pairs:
        if s is not None:
            out[s] += t
    return out
