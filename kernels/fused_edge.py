"""``fused_edge_aggregate``: Scatter-ApplyEdge-Gather in one kernel, no ``[E, F]`` tensor.

NeuGraph fuses an element-wise ApplyEdge with the Gather that follows it: per edge
``u -> v`` and feature column ``f`` an expression of per-vertex and per-edge terms is
evaluated and immediately reduced into the destination's accumulator, so no edge
tensor is ever written. G-GCN's edge stage is the running example::

    out[v] = sum_{u -> v} sigmoid(a[v] + b[u]) * c[u]      # a = W_H x, b = W_C x, c = x

The expression is an :class:`EdgeExpr`, a small frozen DAG over a closed op set:

============  ==================================================================
leaves        ``src(i)``, ``dst(i)``, ``edge(i)`` (the i-th term of that kind),
              ``const(value)``
binary        ``add``, ``sub``, ``mul``, ``div``
unary         ``neg``, ``sigmoid``, ``tanh``, ``relu``, ``leaky_relu(slope)``,
              ``exp``, ``log``
derivative    ``relu_grad`` (``1 if x > 0 else 0``) and
              ``leaky_relu_grad(slope)`` (``1 if x > 0 else slope``): produced by
              :func:`derivative`, usable by anyone
============  ==================================================================

Build expressions with :class:`E` and Python operators::

    gate = E.sigmoid(E.dst(0) + E.src(1)) * E.src(0)
    str(gate)            # 'sigmoid(dst0 + src1) * src0'

Backward passes are derived symbolically: :func:`derivative` applies one rule per op
and returns new :class:`EdgeExpr` s, which the backends evaluate edge by edge the
same way as the forward expression (sharing common subexpressions with it).

The public function validates every argument, then runs a custom autograd Function
whose forward and backward are the registered backend kernels ``"fused_edge_fwd"``
and ``"fused_edge_bwd"`` (``ref/``, ``cpu/``, ``gpu/``). The backend is chosen once,
at forward time, and the same backend runs the backward. Backend contract::

    fused_edge_fwd(indptr, indices, call, src, dst, edge) -> (out [num_dst, F], aux)
    fused_edge_fwd_partials(indptr, indices, call, src, dst, edge, partials)
        -> (out [num_dst, F], [K_i [num_dst, F] for i in partials])     # sum/mean only
    fused_edge_partials_pay(indptr, call) -> bool     # whether the forward should take them
    fused_edge_shared_rows() -> bool                  # whether it reads shared dst rows
    fused_edge_bwd(indptr, indices, get_rev, call, src, dst, edge, aux, grad_out, need)
        -> (src_grads, dst_grads, edge_grads)

``call`` is a :class:`FusedEdgeCall`; ``src``/``dst``/``edge`` are lists of contiguous
term tensors; ``aux`` is ``None`` for sum/mean and, for max/min, the ``[num_dst, F]``
int64 CSC position of the selected edge (-1 without in-edges); ``get_rev()`` returns
the reverse CSR (built on first call); ``need`` says, per term, whether its gradient
is wanted, and each returned list holds a gradient or ``None`` per term.

**Dst partials.** Under ``sum`` (``mean``) a destination's gradient factors:
``d out[v, f] / d dst_i[v, f] = sum_{u -> v} d expr / d dst_i`` (divided by the degree)
does not depend on ``grad_out``, so the forward can sum it while it walks the
destination's in-edges anyway: ``K_i [num_dst, F]``, and the backward's gradient of
``dst_i`` is ``grad_out * K_i``, element-wise, with no graph walk. The walk over
sources that the src gradients need then writes only rows of its own source (no
per-thread ``[num_dst, F]`` buffers, no random read-modify-write of destination rows).
It costs one ``K_i`` saved for backward per term, so it runs only where the backend
says it pays (``fused_edge_partials_pay``): on cpu where the one-walk backward would
otherwise add a ``[num_dst, F]`` buffer per extra thread (two or more threads, a dense
enough graph; on sparse graphs the two walks need no buffer), never on gpu (whose
chunked backward gets dst gradients from the same pass as the others), always on ref
(the specification). It applies to full-width dst terms that need a gradient while
grad mode is on, not in a :func:`~ngra.kernels.backward_only` recompute (its forward is
skipped). ``NGRA_DST_PARTIALS`` (read at each call) or :data:`DST_PARTIALS` overrides the
backend's choice (tests compare both routes).

**Shared rows.** A dst term may be one row ``[1, F]`` that every destination reads (a
parameter vector: the compiler passes a bias or a weight that multiplies edge data so).
A backend that says it reads shared rows (``fused_edge_shared_rows``: cpu) gets that
row as it is: nothing per destination is made for it or saved for backward, it takes no
dst partial, and the backward walk sums its gradient over destinations into one row
(per thread). Other backends get the ``[num_dst, F]`` copy, and their gradient of it
is summed here.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import check_choice, check_csc, check_feat, check_range, check_rev
from ngra.kernels.registry import forward_skipped, lookup, thread_setting
from ngra.kernels.transpose import reverse_of
from ngra.settings import get

__all__ = [
    "EdgeExpr",
    "E",
    "FusedEdgeCall",
    "fused_edge_aggregate",
    "derivative",
    "verify",
    "leaves",
    "topo_order",
    "REDUCERS",
    "OPS",
    "DST_PARTIALS",
    "dst_partials",
    "partials_judged_on",
]

REDUCERS = ("sum", "mean", "max", "min")

LEAF_OPS = ("src", "dst", "edge")
# op -> number of arguments. The closed op set: backends implement exactly these.
OPS: dict[str, int] = {
    "src": 0, "dst": 0, "edge": 0, "const": 0,
    "add": 2, "sub": 2, "mul": 2, "div": 2,
    "neg": 1, "sigmoid": 1, "tanh": 1, "relu": 1, "leaky_relu": 1, "exp": 1, "log": 1,
    "relu_grad": 1, "leaky_relu_grad": 1,
}
_PARAM_OPS = ("const", "leaky_relu", "leaky_relu_grad")  # ops that carry a float ``value``
#: Sum full-width dst terms' partial derivatives in the forward (see "Dst partials" above):
#: ``"auto"`` where the backend says they pay, ``"always"``, or ``"never"``. ``None`` (the
#: default): the ``NGRA_DST_PARTIALS`` environment variable, read at each call
#: (benchmarks, A/B runs); tests and experiments set this to compare routes.
DST_PARTIALS: str | None = None
_MAX_NODES = 4096  # a generated kernel beyond this is a bug in the caller, not a workload


# ============================================================================ the IR
@dataclass(frozen=True, eq=False, repr=False)
class EdgeExpr:
    """One node of an edge expression (immutable, hashable, compared structurally).

    Build nodes with :class:`E` or the Python operators ``+ - * /`` and unary ``-``
    (numbers become ``const`` leaves), not with this constructor.

    Attributes:
        op: one of :data:`OPS`.
        args: argument nodes (``()`` for leaves).
        index: term index for ``src``/``dst``/``edge`` leaves, else ``None``.
        value: the number of a ``const``; the slope of ``leaky_relu``/``leaky_relu_grad``;
            else ``None``.
    """

    op: str
    args: tuple[EdgeExpr, ...] = ()
    index: int | None = None
    value: float | None = None

    def __post_init__(self) -> None:
        # Structural hash computed once: derivative DAGs share nodes, and a recursive
        # hash on every dict lookup would walk them again and again.
        h = hash((self.op, tuple(hash(a) for a in self.args), self.index, self.value))
        object.__setattr__(self, "_hash", h)

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, EdgeExpr) or hash(self) != hash(other):
            return False
        return (self.op, self.index, self.value, self.args) == (
            other.op, other.index, other.value, other.args
        )

    # ---- operators: build larger expressions
    def __add__(self, other: Any) -> EdgeExpr:
        return E.add(self, other)

    def __radd__(self, other: Any) -> EdgeExpr:
        return E.add(other, self)

    def __sub__(self, other: Any) -> EdgeExpr:
        return E.sub(self, other)

    def __rsub__(self, other: Any) -> EdgeExpr:
        return E.sub(other, self)

    def __mul__(self, other: Any) -> EdgeExpr:
        return E.mul(self, other)

    def __rmul__(self, other: Any) -> EdgeExpr:
        return E.mul(other, self)

    def __truediv__(self, other: Any) -> EdgeExpr:
        return E.div(self, other)

    def __rtruediv__(self, other: Any) -> EdgeExpr:
        return E.div(other, self)

    def __neg__(self) -> EdgeExpr:
        return E.neg(self)

    # ---- method forms of the unary ops: (E.dst(0) + E.src(1)).sigmoid() * E.src(0)
    def sigmoid(self) -> EdgeExpr:
        return E.sigmoid(self)

    def tanh(self) -> EdgeExpr:
        return E.tanh(self)

    def relu(self) -> EdgeExpr:
        return E.relu(self)

    def leaky_relu(self, negative_slope: float = 0.01) -> EdgeExpr:
        return E.leaky_relu(self, negative_slope)

    def exp(self) -> EdgeExpr:
        return E.exp(self)

    def log(self) -> EdgeExpr:
        return E.log(self)

    # ---- printing
    def __str__(self) -> str:
        return _format(self, 0)

    def __repr__(self) -> str:
        return f"EdgeExpr({self})"

    def __bool__(self) -> bool:
        return True

    @property
    def is_leaf(self) -> bool:
        """``src``/``dst``/``edge`` term leaf (constants are not terms)."""
        return self.op in LEAF_OPS

    def key(self) -> str:
        """A stable text key (same in every process; Python's ``hash`` is salted).

        Used to name generated kernels; floats are written exactly (``float.hex``).
        """
        memo: dict[EdgeExpr, int] = {}
        lines = []
        for node in topo_order([self]):
            if node.op in LEAF_OPS:
                body = f"{node.op}{node.index}"
            else:
                val = "" if node.value is None else float(node.value).hex()
                body = f"{node.op}({','.join(str(memo[a]) for a in node.args)}){val}"
            memo[node] = len(lines)
            lines.append(body)
        return ";".join(lines)

    def digest(self) -> str:
        """Short hex digest of :meth:`key`."""
        return hashlib.sha256(self.key().encode()).hexdigest()[:20]


_PREC = {"add": 1, "sub": 1, "mul": 2, "div": 2, "neg": 3}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def _format(x: EdgeExpr, parent: int) -> str:
    if x.op in LEAF_OPS:
        return f"{x.op}{x.index}"
    if x.op == "const":
        return f"{x.value:g}"
    if x.op in _INFIX:
        p = _PREC[x.op]
        # a - (b - c), a / (b * c): right operand binds tighter for sub/div
        left = _format(x.args[0], p)
        right = _format(x.args[1], p + (1 if x.op in ("sub", "div") else 0))
        s = f"{left} {_INFIX[x.op]} {right}"
        return f"({s})" if p < parent else s
    if x.op == "neg":
        s = f"-{_format(x.args[0], 3)}"
        return f"({s})" if 3 < parent else s
    inner = _format(x.args[0], 0)
    if x.op in ("leaky_relu", "leaky_relu_grad"):
        return f"{x.op}({inner}, {x.value:g})"
    return f"{x.op}({inner})"


def _coerce(x: Any, what: str) -> EdgeExpr:
    if isinstance(x, EdgeExpr):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return E.const(x)
    raise TypeError(
        f"{what} must be an EdgeExpr or a number; got {type(x).__name__}. "
        "Build leaves with E.src(i), E.dst(i), E.edge(i), E.const(value)."
    )


def _leaf(op: str, index: Any) -> EdgeExpr:
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise TypeError(f"E.{op}(i) takes a non-negative int term index; got {index!r}.")
    return EdgeExpr(op, (), index=index)


def _finite(value: Any, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{what} must be a number; got {type(value).__name__}.")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite; got {value}.")
    return float(value)


class E:
    """Constructors of :class:`EdgeExpr` nodes (a namespace; numbers become constants).

    Example::

        E.sigmoid(E.add(E.dst(0), E.src(1))) * E.src(0)     # G-GCN gate
        E.src(0) * E.edge(0)                                # u_mul_e (GCN)
        E.leaky_relu(E.src(0) + E.dst(0), 0.2).exp()        # unnormalized GAT score
    """

    @staticmethod
    def src(i: int = 0) -> EdgeExpr:
        """``src_terms[i]`` at the edge's source row."""
        return _leaf("src", i)

    @staticmethod
    def dst(i: int = 0) -> EdgeExpr:
        """``dst_terms[i]`` at the edge's destination row."""
        return _leaf("dst", i)

    @staticmethod
    def edge(i: int = 0) -> EdgeExpr:
        """``edge_terms[i]`` at the edge's (CSC) row."""
        return _leaf("edge", i)

    @staticmethod
    def const(value: float) -> EdgeExpr:
        return EdgeExpr("const", (), value=_finite(value, "E.const(value)"))

    @staticmethod
    def add(a: Any, b: Any) -> EdgeExpr:
        return EdgeExpr("add", (_coerce(a, "add: a"), _coerce(b, "add: b")))

    @staticmethod
    def sub(a: Any, b: Any) -> EdgeExpr:
        return EdgeExpr("sub", (_coerce(a, "sub: a"), _coerce(b, "sub: b")))

    @staticmethod
    def mul(a: Any, b: Any) -> EdgeExpr:
        return EdgeExpr("mul", (_coerce(a, "mul: a"), _coerce(b, "mul: b")))

    @staticmethod
    def div(a: Any, b: Any) -> EdgeExpr:
        return EdgeExpr("div", (_coerce(a, "div: a"), _coerce(b, "div: b")))

    @staticmethod
    def neg(a: Any) -> EdgeExpr:
        return EdgeExpr("neg", (_coerce(a, "neg"),))

    @staticmethod
    def sigmoid(a: Any) -> EdgeExpr:
        return EdgeExpr("sigmoid", (_coerce(a, "sigmoid"),))

    @staticmethod
    def tanh(a: Any) -> EdgeExpr:
        return EdgeExpr("tanh", (_coerce(a, "tanh"),))

    @staticmethod
    def relu(a: Any) -> EdgeExpr:
        return EdgeExpr("relu", (_coerce(a, "relu"),))

    @staticmethod
    def leaky_relu(a: Any, negative_slope: float = 0.01) -> EdgeExpr:
        slope = _finite(negative_slope, "leaky_relu negative_slope")
        return EdgeExpr("leaky_relu", (_coerce(a, "leaky_relu"),), value=slope)

    @staticmethod
    def exp(a: Any) -> EdgeExpr:
        return EdgeExpr("exp", (_coerce(a, "exp"),))

    @staticmethod
    def log(a: Any) -> EdgeExpr:
        return EdgeExpr("log", (_coerce(a, "log"),))

    @staticmethod
    def relu_grad(a: Any) -> EdgeExpr:
        """``1 if a > 0 else 0`` (the derivative of relu, 0 at 0 as in torch)."""
        return EdgeExpr("relu_grad", (_coerce(a, "relu_grad"),))

    @staticmethod
    def leaky_relu_grad(a: Any, negative_slope: float = 0.01) -> EdgeExpr:
        """``1 if a > 0 else negative_slope`` (the derivative of leaky_relu)."""
        slope = _finite(negative_slope, "leaky_relu_grad negative_slope")
        return EdgeExpr("leaky_relu_grad", (_coerce(a, "leaky_relu_grad"),), value=slope)


# ============================================================================ IR utilities
def topo_order(roots: Sequence[EdgeExpr]) -> list[EdgeExpr]:
    """Every distinct node reachable from ``roots``, arguments before users.

    Structurally equal subexpressions appear once: this is the common-subexpression
    elimination every backend relies on.
    """
    seen: set[EdgeExpr] = set()
    order: list[EdgeExpr] = []
    for root in roots:
        stack: list[tuple[EdgeExpr, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in seen:
                continue
            if expanded:
                seen.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            for a in reversed(node.args):
                if a not in seen:
                    stack.append((a, False))
    return order


def leaves(expr: EdgeExpr) -> list[tuple[str, int]]:
    """The term leaves ``expr`` reads, e.g. ``[("dst", 0), ("src", 0), ("src", 1)]`` (sorted)."""
    return sorted({(n.op, n.index) for n in topo_order([expr]) if n.op in LEAF_OPS})


def verify(expr: Any) -> None:
    """Check that ``expr`` is a well-formed :class:`EdgeExpr` (closed op set, arities,
    leaf indices, finite parameters). Raises ``TypeError``/``ValueError`` naming the node.
    """
    if not isinstance(expr, EdgeExpr):
        raise TypeError(
            f"expr must be an EdgeExpr (build one with E.src/E.dst/E.edge and operators); "
            f"got {type(expr).__name__}."
        )
    nodes = topo_order([expr])
    if len(nodes) > _MAX_NODES:
        raise ValueError(f"expr has {len(nodes)} distinct nodes; at most {_MAX_NODES} supported.")
    for node in nodes:
        if node.op not in OPS:
            raise ValueError(f"unknown op {node.op!r} in expr; the op set is {sorted(OPS)}.")
        if not isinstance(node.args, tuple) or len(node.args) != OPS[node.op]:
            raise ValueError(
                f"op {node.op!r} takes {OPS[node.op]} argument(s); got {len(node.args)}."
            )
        for a in node.args:
            if not isinstance(a, EdgeExpr):
                raise TypeError(
                    f"argument of {node.op!r} is a {type(a).__name__}, not an EdgeExpr."
                )
        if node.op in LEAF_OPS:
            if not isinstance(node.index, int) or isinstance(node.index, bool) or node.index < 0:
                raise ValueError(
                    f"leaf {node.op!r} needs a non-negative int index; got {node.index!r}."
                )
        elif node.index is not None:
            raise ValueError(f"op {node.op!r} takes no index; got {node.index!r}.")
        if node.op in _PARAM_OPS:
            if not isinstance(node.value, float) or not math.isfinite(node.value):
                raise ValueError(f"op {node.op!r} needs a finite float value; got {node.value!r}.")
        elif node.value is not None:
            raise ValueError(f"op {node.op!r} takes no value; got {node.value!r}.")


# ---- simplifying constructors used by the derivative rules (user expressions are kept as built)
_ZERO = EdgeExpr("const", (), value=0.0)
_ONE = EdgeExpr("const", (), value=1.0)


def _is_const(x: EdgeExpr, v: float | None = None) -> bool:
    return x.op == "const" and (v is None or x.value == v)


def _add(a: EdgeExpr, b: EdgeExpr) -> EdgeExpr:
    if _is_const(a, 0.0):
        return b
    if _is_const(b, 0.0):
        return a
    if _is_const(a) and _is_const(b):
        return E.const(a.value + b.value)
    return EdgeExpr("add", (a, b))


def _sub(a: EdgeExpr, b: EdgeExpr) -> EdgeExpr:
    if _is_const(b, 0.0):
        return a
    if _is_const(a, 0.0):
        return _neg(b)
    if _is_const(a) and _is_const(b):
        return E.const(a.value - b.value)
    return EdgeExpr("sub", (a, b))


def _neg(a: EdgeExpr) -> EdgeExpr:
    if _is_const(a):
        return E.const(-a.value)
    if a.op == "neg":
        return a.args[0]
    return EdgeExpr("neg", (a,))


def _mul(a: EdgeExpr, b: EdgeExpr) -> EdgeExpr:
    if _is_const(a, 0.0) or _is_const(b, 0.0):
        return _ZERO
    if _is_const(a, 1.0):
        return b
    if _is_const(b, 1.0):
        return a
    if _is_const(a, -1.0):
        return _neg(b)
    if _is_const(b, -1.0):
        return _neg(a)
    if _is_const(a) and _is_const(b):
        return E.const(a.value * b.value)
    return EdgeExpr("mul", (a, b))


def _div(a: EdgeExpr, b: EdgeExpr) -> EdgeExpr:
    if _is_const(a, 0.0):
        return _ZERO
    if _is_const(b, 1.0):
        return a
    return EdgeExpr("div", (a, b))


def derivative(expr: EdgeExpr, wrt: EdgeExpr | tuple[str, int]) -> EdgeExpr:
    """The partial derivative of ``expr`` with respect to one term leaf, as an EdgeExpr.

    One rule per op (``x`` the op's result, ``a``/``b`` its arguments, ``da``/``db``
    their derivatives)::

        add: da + db        sub: da - db        mul: da*b + a*db     div: da/b - x/b*db
        neg: -da            exp: x*da           log: da/a            tanh: (1 - x*x)*da
        sigmoid: x*(1 - x)*da                   relu: relu_grad(a)*da
        leaky_relu(s): leaky_relu_grad(a, s)*da relu_grad, leaky_relu_grad, const: 0

    The derivative reuses the nodes of ``expr`` (``x``), so evaluating ``expr`` and its
    derivatives together shares their common subexpressions. Zeros and ones are folded.

    Args:
        expr: the expression.
        wrt: the leaf, ``E.src(1)`` or ``("src", 1)``.

    Returns:
        ``d expr / d wrt`` (``const(0)`` when ``expr`` does not read ``wrt``).
    """
    if isinstance(wrt, tuple):
        wrt = _leaf(wrt[0], wrt[1]) if wrt[0] in LEAF_OPS else None  # type: ignore[assignment]
    if not isinstance(wrt, EdgeExpr) or not wrt.is_leaf:
        raise TypeError(f"wrt must be a src/dst/edge leaf such as E.src(0); got {wrt!r}.")
    d: dict[EdgeExpr, EdgeExpr] = {}
    for x in topo_order([expr]):
        op = x.op
        if op in LEAF_OPS:
            d[x] = _ONE if x == wrt else _ZERO
        elif op in ("const", "relu_grad", "leaky_relu_grad"):
            d[x] = _ZERO
        elif op == "add":
            d[x] = _add(d[x.args[0]], d[x.args[1]])
        elif op == "sub":
            d[x] = _sub(d[x.args[0]], d[x.args[1]])
        elif op == "mul":
            a, b = x.args
            d[x] = _add(_mul(d[a], b), _mul(a, d[b]))
        elif op == "div":
            a, b = x.args
            db = d[b]
            d[x] = _sub(_div(d[a], b), _mul(_div(x, b), db) if not _is_const(db, 0.0) else _ZERO)
        else:
            da = d[x.args[0]]
            if _is_const(da, 0.0):
                d[x] = _ZERO
                continue
            a = x.args[0]
            if op == "neg":
                d[x] = _neg(da)
            elif op == "exp":
                d[x] = _mul(x, da)
            elif op == "log":
                d[x] = _div(da, a)
            elif op == "tanh":
                d[x] = _mul(_sub(_ONE, _mul(x, x)), da)
            elif op == "sigmoid":
                d[x] = _mul(_mul(x, _sub(_ONE, x)), da)
            elif op == "relu":
                d[x] = _mul(E.relu_grad(a), da)
            elif op == "leaky_relu":
                d[x] = _mul(E.leaky_relu_grad(a, x.value), da)
            else:  # pragma: no cover - verify() rejects unknown ops first
                raise ValueError(f"no derivative rule for op {op!r}")
    return d[expr]


# ============================================================================ public op
@dataclass(frozen=True)
class FusedEdgeCall:
    """What the backends receive besides tensors: the expression and the term layout.

    Attributes:
        expr: the verified expression.
        reduce: one of :data:`REDUCERS`.
        num_terms: ``(len(src_terms), len(dst_terms), len(edge_terms))``.
        width: ``F``, the common feature width (output ``[num_dst, F]``).
        dtype: the terms' float dtype (the output's).
    """

    expr: EdgeExpr
    reduce: str
    num_terms: tuple[int, int, int]
    width: int
    dtype: torch.dtype

    def split(self, terms: Sequence[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        """Split a flat term list into ``(src_terms, dst_terms, edge_terms)``."""
        ns, nd, _ = self.num_terms
        return list(terms[:ns]), list(terms[ns:ns + nd]), list(terms[ns + nd:])


def fused_edge_aggregate(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    expr: EdgeExpr,
    src_terms: Sequence[torch.Tensor] = (),
    dst_terms: Sequence[torch.Tensor] = (),
    edge_terms: Sequence[torch.Tensor] = (),
    *,
    reduce: str = "sum",
    rev: Any = None,
) -> torch.Tensor:
    r"""Evaluate an element-wise edge expression and reduce it over in-edges, fused.

    .. math::
        \mathrm{out}_{v,f} = \bigoplus_{e = (u \to v)}
            \mathrm{expr}\big(\mathrm{src}_i[u, f],\ \mathrm{dst}_i[v, f],\
            \mathrm{edge}_i[e, f]\big)

    with :math:`\oplus` = ``reduce``. A term of width 1 broadcasts over ``f``. A
    destination without in-edges gets 0. Differentiable in every term; gradients are
    computed by derivative expressions (:func:`derivative`) in a pass over
    destinations (dst and edge terms) and one over sources (src terms), so neither
    direction forms an ``[E, F]`` tensor; under sum/mean a full-width dst term's
    derivatives are summed in the forward instead (module docs, "Dst partials").
    ``max``/``min`` route each gradient to the first edge (in CSC order) attaining the
    extreme; their NaN handling is unspecified.

    Args:
        indptr: ``[num_dst + 1]`` int32/int64 CSC offsets over destinations.
        indices: ``[E]`` int32/int64 source id of each edge, destination-sorted.
        expr: the :class:`EdgeExpr`; ``E.src(i)`` reads ``src_terms[i]`` etc.
        src_terms: ``[num_src, F]`` or ``[num_src, 1]`` float32/float64 tensors
            (all with the same ``num_src``) (default: none).
        dst_terms: ``[num_dst, F]`` or ``[num_dst, 1]`` tensors, or ``[1, F]`` / ``[1, 1]``:
            one row that every destination reads (default: none).
        edge_terms: ``[E, F]`` or ``[E, 1]`` tensors in CSC edge order (default: none).
        reduce: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"`` (default: ``"sum"``).
        rev: optional reverse CSR for the src-term backward: ``(rev_indptr [num_src + 1],
            rev_indices [E] destination ids, rev_perm [E] CSC position of each CSR edge)``
            or an object with ``indptr``/``indices``/``perm`` such as ``Graph.csr()``
            (default: built on demand, and cached, by :func:`ngra.kernels.transpose.reverse_of`).

    Returns:
        ``[num_dst, F]`` in the terms' dtype, ``F`` the largest term width (1 if none).

    Raises:
        TypeError: wrong types or dtypes, malformed ``expr``.
        ValueError: inconsistent shapes, mixed devices, ``expr`` reading a term that was
            not given, unknown ``reduce``, malformed ``indptr``, out-of-range indices.
    """
    verify(expr)
    check_choice(reduce, "reduce", REDUCERS)
    num_dst = check_csc(indptr, indices)
    num_edges = indices.numel()
    groups = {
        "src": _as_term_list(src_terms, "src_terms"),
        "dst": _as_term_list(dst_terms, "dst_terms"),
        "edge": _as_term_list(edge_terms, "edge_terms"),
    }
    for kind, i in leaves(expr):
        if i >= len(groups[kind]):
            raise ValueError(
                f"expr reads {kind}{i} ({kind}_terms[{i}]) but only {len(groups[kind])} "
                f"{kind}_terms were given; expr = {expr}."
            )
    width, dtype, num_src = _check_terms(groups, num_dst, num_edges, indptr.device)
    if num_src is not None:
        check_range(indices, num_src, "indices", "num_src = rows of src_terms")
    else:  # no src terms: nothing is gathered by source id, any non-negative id is fine
        check_range(indices, 2**62, "indices", "source ids")
        num_src = int(indices.max()) + 1 if num_edges else 0
    rev_t = None
    if rev is not None:
        rev_t = check_rev(rev, num_src, num_dst, num_edges, indptr.device)
    call = FusedEdgeCall(
        expr, reduce, (len(groups["src"]), len(groups["dst"]), len(groups["edge"])), width,
        dtype if dtype is not None else torch.get_default_dtype(),
    )
    shared = tuple(i for i, t in enumerate(groups["dst"]) if t.shape[0] != num_dst)
    partials = (_partials(call, groups["dst"], indptr, shared) if torch.is_grad_enabled()
                else ())
    return _FusedEdge.apply(
        indptr, indices, call, rev_t, num_src, (partials, shared),
        *groups["src"], *groups["dst"], *groups["edge"]
    )


def _reads_shared_rows(device: torch.device) -> bool:
    """Whether the backend for ``device`` reads a one-row dst term as it is."""
    try:
        return bool(lookup("fused_edge_shared_rows", device)())
    except NotImplementedError:
        return False


_judge = threading.local()


@contextlib.contextmanager
def partials_judged_on(indptr: torch.Tensor) -> Iterator[None]:
    """Inside the block, whether dst partials pay is judged on ``indptr`` (``[N + 1]`` CSC
    offsets of another graph) instead of the call's own: a memory budget prices a layer on
    a small sample of its graph, and the sample must take the partials the whole graph
    will take (they pay only on dense enough graphs)."""
    with thread_setting(_judge, "indptr", indptr):
        yield


def dst_partials() -> str:
    """The dst partials mode in force: :data:`DST_PARTIALS` if set, else
    ``NGRA_DST_PARTIALS`` (``"auto"`` when unset)."""
    if DST_PARTIALS is None:
        return str(get("NGRA_DST_PARTIALS"))
    if DST_PARTIALS not in ("auto", "always", "never"):
        raise ValueError("ngra.kernels.fused_edge.DST_PARTIALS must be 'auto', 'always', 'never' "
                         f"or None; got {DST_PARTIALS!r}.")
    return DST_PARTIALS


def _partials(call: FusedEdgeCall, dst: list[torch.Tensor], indptr: torch.Tensor,
              shared: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The dst terms whose summed partial derivatives the forward computes: full-width,
    read by the expression, wanting a gradient, not a shared row, under sum/mean, where
    the backend says they pay (see "Dst partials")."""
    mode = dst_partials()
    if (mode == "never" or call.reduce not in ("sum", "mean")
            or forward_skipped(call.reduce)):
        return ()
    read = {i for kind, i in leaves(call.expr) if kind == "dst"}
    parts = tuple(i for i, t in enumerate(dst) if i in read and i not in shared
                  and t.requires_grad and t.shape[1] == call.width > 1)
    judged = getattr(_judge, "indptr", None)
    if (parts and mode == "auto"
            and not lookup("fused_edge_partials_pay", indptr.device)(
                indptr if judged is None else judged, call)):
        return ()
    return parts


class _FusedEdge(torch.autograd.Function):
    _ARGS = 6  # non-term arguments of apply: indptr, indices, call, rev, num_src, routes

    @staticmethod
    def forward(ctx, indptr, indices, call, rev, num_src, routes, *terms):  # type: ignore[override]
        partials, shared = routes  # dst partials, one-row dst terms (module docs)
        device = indptr.device
        ctx.bwd = lookup("fused_edge_bwd", device)  # same backend as the forward
        ns, num_dst = call.num_terms[0], indptr.numel() - 1
        if shared and not _reads_shared_rows(device):  # the backend gets the copies
            terms = tuple(t.expand(num_dst, -1) if i - ns in shared else t
                          for i, t in enumerate(terms))
            ctx.copied = shared
        else:
            ctx.copied = ()
        terms = tuple(t.contiguous() for t in terms)
        src, dst, edge = call.split(terms)
        aux, ks = None, []
        if forward_skipped(call.reduce):
            out = indptr.new_zeros((), dtype=call.dtype).expand(indptr.numel() - 1, call.width)
        elif partials:
            fwd = lookup("fused_edge_fwd_partials", device)
            out, ks = fwd(indptr, indices, call, src, dst, edge, partials)
        else:
            out, aux = lookup("fused_edge_fwd", device)(indptr, indices, call, src, dst, edge)
        ctx.call, ctx.rev, ctx.num_src, ctx.partials = call, rev, num_src, partials
        ctx.has_aux = aux is not None
        ctx.save_for_backward(indptr, indices, *((aux,) if ctx.has_aux else ()), *ks, *terms)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        saved = ctx.saved_tensors
        indptr, indices = saved[:2]
        rest = saved[2:]
        aux = rest[0] if ctx.has_aux else None
        rest = rest[1:] if ctx.has_aux else rest
        partials: tuple[int, ...] = ctx.partials
        ks, terms = rest[:len(partials)], rest[len(partials):]
        call: FusedEdgeCall = ctx.call
        skip = (None,) * _FusedEdge._ARGS
        needs = ctx.needs_input_grad[_FusedEdge._ARGS:]
        if not any(needs):
            return skip + (None,) * len(terms)
        src, dst, edge = call.split(terms)
        ns, nd, _ = call.num_terms
        g = grad_out.to(call.dtype).contiguous()
        # dst terms with partials: grad_out * K, no walk; the backend skips them
        dst_need = [n and i not in partials for i, n in enumerate(needs[ns:ns + nd])]
        need = (tuple(needs[:ns]), tuple(dst_need), tuple(needs[ns + nd:]))
        if any(itertools.chain(*need)):

            def get_rev() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                # built only when a src term needs a gradient; cached per graph tensors
                return reverse_of(indptr, indices, ctx.num_src, ctx.rev)

            gs, gd, ge = ctx.bwd(indptr, indices, get_rev, call, src, dst, edge, aux, g, need)
            gd = list(gd)
        else:
            gs, gd, ge = [None] * ns, [None] * nd, [None] * (len(terms) - ns - nd)
        for i, k in zip(partials, ks):
            if needs[ns + i]:
                gd[i] = g * k
        for i in ctx.copied:  # gradient of the copy -> of the row
            if gd[i] is not None:
                gd[i] = gd[i].sum(0, keepdim=True)
        return skip + tuple(gs) + tuple(gd) + tuple(ge)


# ============================================================================ validation
def _as_term_list(terms: Any, name: str) -> list[torch.Tensor]:
    if terms is None:
        return []
    if isinstance(terms, torch.Tensor):
        raise TypeError(
            f"{name} must be a list/tuple of tensors; got a single tensor. Wrap it: [{name[:-1]}]."
        )
    if not isinstance(terms, Sequence):
        raise TypeError(f"{name} must be a list/tuple of tensors; got {type(terms).__name__}.")
    for i, t in enumerate(terms):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{i}] must be a torch.Tensor; got {type(t).__name__}.")
    return list(terms)


def _iter_terms(groups: dict[str, list[torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for kind, ts in groups.items():
        for i, t in enumerate(ts):
            yield f"{kind}_terms[{i}]", t


def _check_terms(
    groups: dict[str, list[torch.Tensor]], num_dst: int, num_edges: int, device: torch.device
) -> tuple[int, torch.dtype | None, int | None]:
    """Validate every term; returns ``(F, dtype or None, num_src or None)``."""
    for name, t in _iter_terms(groups):
        check_feat(t, name)
        if t.device != device:
            raise ValueError(f"{name} must be on {device} like the graph; got {t.device}.")
        if t.dim() != 2:
            hint = " Use .unsqueeze(-1) for one value per row." if t.dim() == 1 else ""
            raise ValueError(
                f"{name} must be 2-D [rows, F] or [rows, 1]; got shape {list(t.shape)}.{hint}"
            )
    dtypes = {t.dtype for _, t in _iter_terms(groups)}
    if len(dtypes) > 1:
        got = ", ".join(f"{n}: {t.dtype}" for n, t in _iter_terms(groups))
        raise TypeError(f"all terms must share one dtype; got {got}.")
    rows = {"dst": (num_dst, "num_dst = len(indptr) - 1"), "edge": (num_edges, "E = len(indices)")}
    for kind in ("dst", "edge"):
        want, why = rows[kind]
        for i, t in enumerate(groups[kind]):
            if t.shape[0] != want and not (kind == "dst" and t.shape[0] == 1):
                shared = " (or 1, a row every destination reads)" if kind == "dst" else ""
                raise ValueError(
                    f"{kind}_terms[{i}] must have {why} = {want} rows{shared}; got {t.shape[0]}."
                )
    num_src = None
    if groups["src"]:
        num_src = groups["src"][0].shape[0]
        for i, t in enumerate(groups["src"]):
            if t.shape[0] != num_src:
                raise ValueError(
                    f"src_terms must all have num_src rows; src_terms[0] has {num_src}, "
                    f"src_terms[{i}] has {t.shape[0]}."
                )
    widths = {t.shape[1] for _, t in _iter_terms(groups)}
    if 0 in widths:
        raise ValueError("every term needs at least one column; got a width-0 term.")
    wide = widths - {1}
    if len(wide) > 1:
        got = ", ".join(f"{n}: {t.shape[1]}" for n, t in _iter_terms(groups))
        raise ValueError(f"term widths must be 1 or one common F; got {got}.")
    width = wide.pop() if wide else 1
    return width, (dtypes.pop() if dtypes else None), num_src
