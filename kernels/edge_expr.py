"""The fused edge kernels' expression IR: :class:`EdgeExpr`, built with :class:`E`.

An ApplyEdge that :mod:`ngra.kernels.fused_edge` runs inside its Gather is written as an
expression of per-vertex and per-edge terms, evaluated per edge and feature column.
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

:func:`verify` checks an expression against the op set; :func:`topo_order` and
:func:`leaves` walk it, as the code generators of ``cpu/`` and ``gpu/`` do.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["E", "EdgeExpr", "LEAF_OPS", "OPS", "derivative", "leaves", "topo_order", "verify"]

LEAF_OPS = ("src", "dst", "edge")
# op -> number of arguments. The closed op set: backends implement exactly these.
OPS: dict[str, int] = {
    "src": 0, "dst": 0, "edge": 0, "const": 0,
    "add": 2, "sub": 2, "mul": 2, "div": 2,
    "neg": 1, "sigmoid": 1, "tanh": 1, "relu": 1, "leaky_relu": 1, "exp": 1, "log": 1,
    "relu_grad": 1, "leaky_relu_grad": 1,
}
_PARAM_OPS = ("const", "leaky_relu", "leaky_relu_grad")  # ops that carry a float ``value``
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
