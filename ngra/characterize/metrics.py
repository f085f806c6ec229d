"""Analytic FLOPs and bytes per SAGA stage: the work a model's math requires.

The counts describe the algorithm, not one framework's implementation, so the
same numbers divide every framework's measured stage times ("useful" FLOP/s
and bandwidth): a framework doing redundant work shows up as a lower achieved
rate, not as more FLOPs. Conventions:

* float32 values (4 bytes), int64 indices (8 bytes); a multiply-add is 2 FLOPs;
  ``exp``, ``max``, ``leaky_relu``, ``sigmoid``, ``tanh`` and divisions count 1.
* Bytes are compulsory traffic of each stage run as its own pass over memory
  (the SAGA dataflow): inputs read once, outputs written once, caches ignored.
  A Scatter reads one ``F``-wide row per edge (random rows: no reuse assumed)
  plus the index, and writes the ``[E, F]`` per-edge tensor; ApplyEdge reads
  and writes per-edge tensors; Gather reads the per-edge tensor and the CSC
  ``indptr`` and writes ``[N, F]``; ApplyVertex reads its vertex inputs and
  weights and writes its output.
* Linear layers adjacent to a linear aggregation run in the cheaper order
  (transform first when ``f_out < f_in``), as width-aware systems do
  (DGL, ngra's compiler): GCN and SAGE propagate ``min(f_in, f_out)`` columns;
  GIN propagates ``f_in`` (its MLP follows ``(1 + eps) x + sum``).
* Per-edge terms that depend only on one endpoint are computed per vertex
  (GAT's ``W h`` and ``a^T W h``, GG-NN's ``A_t h``, R-GCN's ``W_r h``): these
  hoisted terms are ApplyEdge work of ``N`` rows, not ``E``.
* A *fused* layer (one kernel for Scatter + ApplyEdge + Gather, e.g. g-SpMM
  or one-pass softmax aggregation) is charged to Gather: the per-edge FLOPs of
  the three stages, and only the gathered rows, indices, edge data and the
  ``[N, F]`` result as bytes: no per-edge tensor is written.
* Training adds a backward estimated as twice the forward FLOPs and bytes per
  stage (each matmul needs ``dX`` and ``dW``; element-wise backward reads the
  saved input and the incoming gradient), except Scatter, whose backward is
  one scatter-add of the gathered elements (FLOPs = gathered elements). This is
  an estimate: e.g. the first layer needs no ``dX``.

Every formula is written out per model in :func:`layer_counts`.

**Executed work** (``model_counts(..., input_nnz=...)``): the roofline plots what a
run executed, which differs from the algorithm's count in one place. ngra's
compiled plans run the first layer's Linears of the raw input features through
:mod:`ngra.kernels.sparse_input` (a CSR product, when at most 5% of ``x`` is
non-zero: bag-of-words features), so they execute ``2 nnz k`` FLOPs, not
``2 N f_in k``, and read ``nnz`` values and column indices plus a row pointer,
not ``[N, f_in]``; their backward is the weight gradient alone (``x^T g``,
``2 nnz k``; ``x`` needs no gradient). Divided by the dense count, Cora's and
CiteSeer's first-layer transforms landed 1.3-4.8x above the measured sgemm
roof. Which Linears take that path is listed per model in :func:`input_linears`
(checked against the kernel's calls in the tests); the measurement records
``nnz`` only where it did (:attr:`~ngra.characterize.measure.RunResult.input_nnz`).
PyG, DGL and ``ngra-generic`` multiply densely: their executed counts are the
analytic ones. (``ngra-generic`` runs per-edge Linears of ``edge.src`` per edge,
more than the hoisted count here: its rates are useful work, a lower bound.)
"""

from __future__ import annotations

from dataclasses import dataclass

from ngra.characterize.stages import STAGES

__all__ = ["Count", "LayerDims", "layer_dims", "layer_counts", "model_counts", "gathered_elements",
           "input_linears", "FLOAT", "INDEX"]

FLOAT = 4
INDEX = 8


@dataclass(frozen=True)
class Count:
    """FLOPs and bytes of one stage."""

    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: Count) -> Count:
        return Count(self.flops + other.flops, self.bytes + other.bytes)

    def __sub__(self, other: Count) -> Count:
        return Count(self.flops - other.flops, self.bytes - other.bytes)

    def scale(self, flops: float, bytes_: float) -> Count:
        return Count(self.flops * flops, self.bytes * bytes_)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("nan")


@dataclass(frozen=True)
class LayerDims:
    """One layer's widths: ``f_in -> f_out`` (``heads`` x ``f_out`` for GAT).

    Attributes:
        model: zoo name. f_in, f_out: widths (GAT: per head). heads: GAT heads.
        types: edge types (GG-NN, R-GCN). hidden: GIN's MLP hidden width.
    """

    model: str
    f_in: int
    f_out: int
    heads: int = 1
    types: int = 1
    hidden: int = 0


def layer_dims(model: str, in_dim: int, hidden: int, num_classes: int, *, heads: int = 8,
               num_types: int = 1, num_layers: int = 2) -> list[LayerDims]:
    """The layers of zoo model ``model`` as :func:`ngra.models.build_model` builds them.

    GAT: ``hidden`` is the total width of a hidden layer, ``heads`` heads of
    ``hidden // heads``; the last layer has one head. GG-NN: ``num_layers``
    steps of width ``hidden`` (its input/output linears are outside the layers).
    """
    widths = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
    pairs = list(zip(widths[:-1], widths[1:]))
    if model == "gat":
        d = max(hidden // heads, 1)
        out, f = [], in_dim
        for _ in range(num_layers - 1):
            out.append(LayerDims("gat", f, d, heads=heads))
            f = d * heads
        out.append(LayerDims("gat", f, num_classes, heads=1))
        return out
    if model == "ggnn":
        return [LayerDims("ggnn", hidden, hidden, types=num_types) for _ in range(num_layers)]
    if model == "gin":
        return [LayerDims("gin", a, b, hidden=hidden) for a, b in pairs]
    if model == "rgcn":
        return [LayerDims("rgcn", a, b, types=num_types) for a, b in pairs]
    if model in ("gcn", "sage"):
        return [LayerDims(model, a, b) for a, b in pairs]
    raise ValueError(f"no analytic model for {model!r}; known: gcn, gat, sage, gin, ggnn, rgcn.")


def layer_counts(d: LayerDims, n: int, e: int, fused: bool = False) -> dict[str, Count]:
    """Forward FLOPs/bytes per stage of one layer on ``n`` vertices and ``e`` edges."""
    F, I = FLOAT, INDEX
    indptr = (n + 1) * I
    if d.model in ("gcn", "sage", "gin"):
        a, b = d.f_in, d.f_out
        p = a if d.model == "gin" else min(a, b)
        scatter = Count(0, e * p * F + e * I + e * p * F)
        if d.model == "gcn":
            apply_edge = Count(e * p, e * p * F + e * F + e * p * F)   # src * w
            gather = Count(e * p, e * p * F + indptr + n * p * F)      # sum
            apply_vertex = Count(2 * n * a * b + n * b, n * a * F + (a * b + b) * F + n * b * F)
            fused_gather = Count(2 * e * p, e * p * F + e * I + e * F + indptr + n * p * F)
        elif d.model == "sage":
            apply_edge = Count(0, 0)                                   # copy of src
            gather = Count(e * p + n * p, e * p * F + indptr + n * p * F)  # mean
            apply_vertex = Count(4 * n * a * b + 2 * n * b,
                                 n * a * F + n * p * F + (2 * a * b + b) * F + n * b * F)
            fused_gather = Count(e * p + n * p, e * p * F + e * I + indptr + n * p * F)
        else:  # gin
            m = d.hidden or b
            apply_edge = Count(0, 0)
            gather = Count(e * p, e * p * F + indptr + n * p * F)
            apply_vertex = Count(2 * n * a + 2 * n * a * m + 2 * n * m + 2 * n * m * b + n * b,
                                 2 * n * a * F + (a * m + m + m * b + b) * F
                                 + 2 * n * m * F + n * b * F)
            fused_gather = Count(e * p, e * p * F + e * I + indptr + n * p * F)
        hoisted = Count(0, 0)
    elif d.model == "gat":
        a, h = d.f_in, d.heads
        hd = h * d.f_out
        # hoisted: W x, then a_src . (W x) and a_dst . (W x) per vertex
        hoisted = Count(2 * n * a * hd + 4 * n * hd,
                        n * a * F + a * hd * F + n * hd * F                  # W x
                        + n * hd * F + 2 * hd * F + 2 * n * h * F)           # a . W x
        scatter = Count(0, 2 * e * (hd + 2 * h) * F + 2 * e * I)   # W x[src], el[src], er[dst]
        apply_edge = Count(2 * e * h, 2 * e * h * F + e * h * F)   # el + er, leaky_relu
        # softmax gather: max, sub, exp, sum over scores; weighted sum of values; normalize
        gather = Count(4 * e * h + 2 * e * hd + n * hd,
                       e * h * F + e * hd * F + indptr + n * hd * F)
        out_w = hd if h > 1 else d.f_out
        apply_vertex = Count(n * out_w, 2 * n * out_w * F + out_w * F)   # + bias
        fused_gather = Count(2 * e * h + 4 * e * h + 2 * e * hd + n * hd,
                             e * hd * F + e * h * F + n * h * F + e * I + indptr + n * hd * F)
    elif d.model == "ggnn":
        w, r = d.f_in, d.types
        hoisted = Count(2 * n * w * r * w, n * w * F + r * w * w * F + n * r * w * F)   # A_t h
        scatter = Count(0, e * w * F + 2 * e * I + e * w * F)   # row (src, type) per edge
        apply_edge = Count(0, 0)                                # the type choice is the row index
        gather = Count(e * w, e * w * F + indptr + n * w * F)
        apply_vertex = Count(12 * n * w * w + 17 * n * w,       # GRU cell
                             2 * n * w * F + (6 * w * w + 6 * w) * F + n * w * F)
        fused_gather = Count(e * w, e * w * F + 2 * e * I + indptr + n * w * F)
    elif d.model == "rgcn":
        a, b, r = d.f_in, d.f_out, d.types
        hoisted = Count(2 * n * a * r * b, n * a * F + r * a * b * F + n * r * b * F)   # W_r h
        scatter = Count(0, e * b * F + 2 * e * I + e * b * F)
        apply_edge = Count(e * b, e * b * F + e * F + e * b * F)    # * 1/c_{v,r}
        gather = Count(e * b, e * b * F + indptr + n * b * F)
        apply_vertex = Count(2 * n * a * b + 2 * n * b,             # root + bias + acc
                             n * a * F + (a * b + b) * F + n * b * F + n * b * F)
        fused_gather = Count(2 * e * b, e * b * F + 2 * e * I + e * F + indptr + n * b * F)
    else:
        raise ValueError(f"no analytic model for {d.model!r}.")
    if fused:
        return {"Scatter": Count(0, 0), "ApplyEdge": hoisted, "Gather": fused_gather,
                "ApplyVertex": apply_vertex}
    return {"Scatter": scatter, "ApplyEdge": hoisted + apply_edge, "Gather": gather,
            "ApplyVertex": apply_vertex}


def gathered_elements(d: LayerDims, e: int) -> int:
    """Values the layer's Scatter copies per pass (its backward scatter-adds as many)."""
    if d.model == "gin":
        return e * d.f_in
    if d.model in ("gcn", "sage"):
        return e * min(d.f_in, d.f_out)
    if d.model == "gat":
        return e * (d.heads * d.f_out + 2 * d.heads)
    return e * d.f_out


def input_linears(d: LayerDims) -> dict[str, int]:
    """Per stage, the summed output width of the Linears that read layer ``d``'s input
    ``x`` itself and that ngra's compiled plan runs through
    :func:`ngra.kernels.sparse_input.linear` (as a first layer on mostly-zero ``x``).

    GCN's ``lin`` and SAGE's ``lin_l`` read ``x`` only when the transform runs first
    (``f_out < f_in``, the reorder pass); SAGE's ``lin_r`` always does; GAT's and
    R-GCN's per-edge Linears of ``edge.src`` are hoisted to one ``W x``. R-GCN's
    ``root`` runs as its module's dense ``F.linear``; GIN's MLP reads the aggregate
    and GG-NN's layers read the input Linear's output (outside the layers).
    """
    if d.model == "gcn":
        return {"ApplyVertex": d.f_out} if d.f_out < d.f_in else {}
    if d.model == "sage":
        return {"ApplyVertex": (2 if d.f_out < d.f_in else 1) * d.f_out}
    if d.model == "gat":
        return {"ApplyEdge": d.heads * d.f_out}
    if d.model == "rgcn":
        return {"ApplyEdge": d.types * d.f_out}
    return {}


def _sparse_input(d: LayerDims, n: int, nnz: int, width: int,
                  training: bool) -> tuple[Count, Count]:
    """(what the dense count holds, what ran): Linears of total width ``width`` reading
    ``x`` ``[n, f_in]`` once, densely vs as a CSR product over ``nnz`` non-zeros (forward,
    plus with ``training`` the analytic backward vs the weight gradient ``x^T g``)."""
    F, I = FLOAT, INDEX
    dense = Count(2 * n * d.f_in * width, n * d.f_in * F)
    sparse = Count(2 * nnz * width, nnz * (F + I) + (n + 1) * I)
    if training:
        dense = dense + dense.scale(2.0, 2.0)
        # csr_t @ g: read x^T's CSR and g [n, width], write dW [f_in, width]
        sparse = sparse + Count(2 * nnz * width, nnz * (F + I) + (d.f_in + 1) * I
                                + n * width * F + d.f_in * width * F)
    return dense, sparse


def _backward(stage: str, fwd: Count, gathered: float) -> Count:
    if stage == "Scatter":
        return Count(gathered if fwd.bytes else 0.0, fwd.bytes)
    return fwd.scale(2.0, 2.0)


def model_counts(layers: list[LayerDims], n: int, e: int, *, training: bool = False,
                 fused: bool | list[bool] = False, input_nnz: int = 0) -> dict[str, Count]:
    """Per-stage counts of a model (sum over its layers); training adds the backward.

    Args:
        fused: one flag for all layers, or one per layer.
        input_nnz: non-zeros of the input features when the first layer's
            :func:`input_linears` ran as sparse products (executed work, see the module
            docstring); 0: the dense GEMMs the algorithm needs.
    """
    flags = fused if isinstance(fused, list) else [fused] * len(layers)
    if len(flags) != len(layers):
        raise ValueError(f"fused needs one flag per layer ({len(layers)}); got {len(flags)}.")
    total = {s: Count() for s in STAGES}
    for i, (d, f) in enumerate(zip(layers, flags)):
        fwd = layer_counts(d, n, e, fused=f)
        sparse = input_linears(d) if i == 0 and input_nnz > 0 else {}
        for s in STAGES:
            c = fwd[s]
            if training:
                c = c + _backward(s, c, gathered_elements(d, e))
            if s in sparse:
                dense, ran = _sparse_input(d, n, input_nnz, sparse[s], training)
                c = c - dense + ran
            total[s] = total[s] + c
    return total
