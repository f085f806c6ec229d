"""The stage IR: a SAGA program as three small DAGs over a closed op set.

A :class:`Program` holds the layer's computation in three stages:

* ``pre``: per-vertex work (rows = vertices). Its inputs are ``VERTEX`` nodes;
  its outputs are the *terms*, a dict ``key -> node``. Before any pass the terms
  are the vertex data itself (``("x", k)``); passes add hoisted terms (``("t", i)``).
* ``edge``: ApplyEdge (rows = edges). ``SRC(key)`` / ``DST(key)`` read a term at
  each edge's source / destination row, ``EDATA(key)`` reads edge data. Its outputs
  are the messages: one node, a dict of nodes, or ``(score, value)`` for softmax.
* ``vertex``: ApplyVertex (rows = vertices), inputs ``VERTEX`` and ``ACC``.

Every node is one :class:`Op` of a closed enum; anything else the UDF calls is an
``OPAQUE`` node that still executes (see :mod:`ngra.compiler.interp`) but blocks
fusion. :func:`verify` checks a program and runs between passes. The reference
interpreter (:mod:`ngra.compiler.interp`) is the living definition of each op.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Op", "Node", "Ref", "Stage", "Program", "IRError", "verify", "ELEMENTWISE", "INPUTS",
    "SHAPE_OPS", "format_node", "format_key", "map_refs", "iter_refs", "remap_args",
]


class Op(enum.Enum):
    """The closed op set of the stage IR."""

    # inputs
    SRC = "src"            # attrs: key          term row at each edge's source
    DST = "dst"            # attrs: key          term row at each edge's destination
    EDATA = "edata"        # attrs: key          edge data (None: a plain tensor)
    VERTEX = "vertex"      # attrs: key          vertex data (None: a plain tensor)
    ACC = "acc"            # attrs: key          the gathered accumulator
    PARAM = "param"        # attrs: path[, cols] a layer tensor (parameter/buffer), read at run time;
                           #                     cols=(a, b): its column block [:, a:b]
    CONST = "const"        # attrs: value        a Python number or a constant tensor
    # dense
    LINEAR = "linear"      # attrs: module       args (x, weight[, bias])
    # element-wise
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    NEG = "neg"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    RELU = "relu"
    LEAKY_RELU = "leaky_relu"  # attrs: slope
    EXP = "exp"
    LOG = "log"
    # shape
    VIEW = "view"          # attrs: shape
    RESHAPE = "reshape"    # attrs: shape
    UNSQUEEZE = "unsqueeze"  # attrs: dim
    SQUEEZE = "squeeze"    # attrs: dim (None: every size-1 dim)
    FLATTEN = "flatten"    # attrs: start, end
    EXPAND = "expand"      # attrs: sizes
    # reductions over feature dims
    SUM = "sum"            # attrs: dim, keepdim
    MEAN = "mean"          # attrs: dim, keepdim
    ROWDOT = "rowdot"      # args (x, w): (x * w).sum(-1) with w the same for every row
                           # (ngra.kernels.rowdot); made by the contract pass, never traced
    # selection along a feature dim
    GATHER = "gather"      # attrs: dim          args (input, index)
    INDEX_SELECT = "index_select"  # attrs: dim  args (input, index)
    CAT = "cat"            # attrs: dim          args: the tensors
    # anything else: executable, never fused
    OPAQUE = "opaque"      # attrs: kind, target, template, rowwise_ok, random, inplace


INPUTS = frozenset({Op.SRC, Op.DST, Op.EDATA, Op.VERTEX, Op.ACC})
LEAVES = INPUTS | {Op.PARAM, Op.CONST}
UNARY = frozenset({Op.NEG, Op.SIGMOID, Op.TANH, Op.RELU, Op.LEAKY_RELU, Op.EXP, Op.LOG})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV})
ELEMENTWISE = UNARY | BINARY
SHAPE_OPS = frozenset({Op.VIEW, Op.RESHAPE, Op.UNSQUEEZE, Op.SQUEEZE, Op.FLATTEN, Op.EXPAND})

# op -> (min args, max args or None for variadic)
ARITY: dict[Op, tuple[int, int | None]] = {
    **{op: (0, 0) for op in LEAVES},
    Op.LINEAR: (2, 3),
    **{op: (1, 1) for op in UNARY},
    **{op: (2, 2) for op in BINARY},
    **{op: (1, 1) for op in SHAPE_OPS},
    Op.SUM: (1, 1), Op.MEAN: (1, 1), Op.ROWDOT: (2, 2),
    Op.GATHER: (2, 2), Op.INDEX_SELECT: (2, 2),
    Op.CAT: (1, None),
    Op.OPAQUE: (0, None),
}

# op -> required attribute names
ATTRS: dict[Op, tuple[str, ...]] = {
    Op.SRC: ("key",), Op.DST: ("key",), Op.EDATA: ("key",), Op.VERTEX: ("key",),
    Op.ACC: ("key",), Op.PARAM: ("path",), Op.CONST: ("value",), Op.LINEAR: ("module",),
    Op.LEAKY_RELU: ("slope",), Op.VIEW: ("shape",), Op.RESHAPE: ("shape",),
    Op.UNSQUEEZE: ("dim",), Op.SQUEEZE: ("dim",), Op.FLATTEN: ("start", "end"),
    Op.EXPAND: ("sizes",), Op.SUM: ("dim", "keepdim"), Op.MEAN: ("dim", "keepdim"),
    Op.GATHER: ("dim",), Op.INDEX_SELECT: ("dim",), Op.CAT: ("dim",),
    Op.OPAQUE: ("kind", "target", "template", "rowwise_ok", "random", "inplace"),
}

# which input ops each stage may read
STAGE_INPUTS = {
    "pre": frozenset({Op.VERTEX}),
    "edge": frozenset({Op.SRC, Op.DST, Op.EDATA}),
    "vertex": frozenset({Op.VERTEX, Op.ACC}),
}
INPUT_DOMAIN = {Op.SRC: "src", Op.DST: "dst", Op.EDATA: "edge", Op.VERTEX: "vertex",
                Op.ACC: "acc"}


class IRError(ValueError):
    """A malformed program (raised by :func:`verify`)."""


@dataclass(frozen=True)
class Ref:
    """A reference to node ``id`` inside an output structure or an OPAQUE template."""

    id: int


@dataclass
class Node:
    """One IR node.

    Attributes:
        id: unique within the program.
        op: the :class:`Op`.
        args: ids of argument nodes (earlier in the same stage).
        attrs: op attributes (see ``ATTRS``).
        name: a readable name (the traced variable's name).
        shape: full shape of the node on the sample rows, or ``None`` when unknown;
            dim 0 is the row dim when ``rowwise``.
        dtype: the sample's dtype, or ``None``.
        deps: the inputs the node depends on, a subset of
            ``{"src", "dst", "edge", "vertex", "acc"}`` (empty: parameters/constants only).
        rowwise: row ``i`` of the result depends only on row ``i`` of its inputs.
    """

    id: int
    op: Op
    args: tuple[int, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    shape: tuple[int, ...] | None = None
    dtype: Any = None
    deps: frozenset[str] = frozenset()
    rowwise: bool = False

    @property
    def rest(self) -> tuple[int, ...] | None:
        """The non-row dims of a row-wise node (``None`` if unknown)."""
        return None if self.shape is None else tuple(self.shape[1:])


@dataclass
class Stage:
    """One stage: nodes in topological order and the output structure (with :class:`Ref` leaves)."""

    kind: str
    nodes: dict[int, Node] = field(default_factory=dict)
    outputs: Any = None

    def add(self, node: Node) -> Node:
        self.nodes[node.id] = node
        return node

    def users(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {i: [] for i in self.nodes}
        for n in self.nodes.values():
            for a in n.args:
                if a in out:
                    out[a].append(n.id)
        return out

    def output_ids(self) -> list[int]:
        return [r.id for r in iter_refs(self.outputs)]

    def ancestors(self, roots: list[int]) -> list[int]:
        """Ids of ``roots`` and everything they read, in topological order."""
        need: set[int] = set()
        stack = list(roots)
        while stack:
            i = stack.pop()
            if i in need:
                continue
            need.add(i)
            stack.extend(self.nodes[i].args)
        return [i for i in self.nodes if i in need]

    def prune(self) -> None:
        """Dead-code elimination: drop nodes no output reads."""
        keep = set(self.ancestors(self.output_ids()))
        self.nodes = {i: n for i, n in self.nodes.items() if i in keep}


@dataclass
class Program:
    """A SAGA layer as stages; ``terms`` describes every pre output (for explain)."""

    layer_name: str
    gather: str
    pre: Stage
    edge: Stage
    vertex: Stage | None
    terms: dict[Any, dict[str, Any]] = field(default_factory=dict)
    next_id: int = 0
    vertex_rewritten: bool = False  # post must run the vertex IR, not the UDF
    # the sink pass: a Linear moved from the end of ApplyEdge to after the gather,
    # {"module": name, "weight": PARAM attrs, "bias": PARAM attrs or None}
    # (applied by interp.apply_sink), or None
    sink: dict[str, Any] | None = None
    lowering: dict[Any, Any] = field(default_factory=dict)  # message key -> kernel match (fuse)
    # stage kind -> why it must run exactly as written (random or in-place calls), found
    # before dead-code elimination so that an unused in-place call still counts
    as_written: dict[str, str] = field(default_factory=dict)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def stages(self) -> list[Stage]:
        return [s for s in (self.pre, self.edge, self.vertex) if s is not None]


# ---------------------------------------------------------------------------- structures
def iter_refs(struct: Any):
    """Every :class:`Ref` inside a nested tuple/list/dict structure."""
    if isinstance(struct, Ref):
        yield struct
    elif isinstance(struct, (tuple, list)):
        for s in struct:
            yield from iter_refs(s)
    elif isinstance(struct, dict):
        for s in struct.values():
            yield from iter_refs(s)
    elif isinstance(struct, slice):
        for s in (struct.start, struct.stop, struct.step):
            yield from iter_refs(s)


def map_refs(struct: Any, fn: Any) -> Any:
    """``struct`` with every :class:`Ref` ``r`` replaced by ``fn(r)``."""
    if isinstance(struct, Ref):
        return fn(struct)
    if isinstance(struct, tuple):
        return tuple(map_refs(s, fn) for s in struct)
    if isinstance(struct, list):
        return [map_refs(s, fn) for s in struct]
    if isinstance(struct, dict):
        return {k: map_refs(v, fn) for k, v in struct.items()}
    if isinstance(struct, slice):
        return slice(map_refs(struct.start, fn), map_refs(struct.stop, fn),
                     map_refs(struct.step, fn))
    return struct


# ---------------------------------------------------------------------------- verifier
def remap_args(n: Node, remap: dict[int, int]) -> None:
    """Point ``n``'s arguments (and an OPAQUE template's refs) at ``remap[old id]``."""
    if any(a in remap for a in n.args):
        n.args = tuple(remap.get(a, a) for a in n.args)
        if n.op == Op.OPAQUE:
            n.attrs["template"] = map_refs(n.attrs["template"],
                                           lambda r: Ref(remap.get(r.id, r.id)))


def verify(program: Program, *, annotated: bool = False) -> None:
    """Check that ``program`` is well formed; raise :class:`IRError` naming the node.

    Checks: every stage is a DAG in topological order (arguments are earlier nodes of
    the same stage), ids are unique, ops are members of :class:`Op` with the right
    arity and attributes, each stage reads only its own inputs, outputs refer to
    existing nodes, edge-stage terms exist in ``pre``'s outputs, a softmax program's
    edge stage returns ``(score, value)``, linear weights do not depend on rows, and
    (``annotated=True``) each node's ``deps`` is the union of its arguments'.
    """
    if not isinstance(program, Program):
        raise IRError(f"expected a Program; got {type(program).__name__}.")
    seen: set[int] = set()
    for stage in program.stages():
        _verify_stage(stage, seen, annotated)
    if not isinstance(program.pre.outputs, dict):
        raise IRError("pre stage outputs must be a dict term key -> Ref.")
    for n in program.edge.nodes.values():
        if n.op in (Op.SRC, Op.DST) and n.attrs["key"] not in program.pre.outputs:
            raise IRError(
                f"edge node %{n.id} ({n.op.value}) reads term {format_key(n.attrs['key'])}, "
                f"which the pre stage does not produce (terms: "
                f"{[format_key(k) for k in program.pre.outputs]})."
            )
    if program.gather == "softmax":
        out = program.edge.outputs
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(o, Ref) for o in out)):
            raise IRError("a softmax program's edge stage must output (score, value).")


def _verify_stage(stage: Stage, seen: set[int], annotated: bool) -> None:
    if stage.kind not in STAGE_INPUTS:
        raise IRError(f"unknown stage kind {stage.kind!r}; expected one of {sorted(STAGE_INPUTS)}.")
    local: set[int] = set()
    for nid, n in stage.nodes.items():
        where = f"{stage.kind} stage node %{nid}"
        if not isinstance(n, Node) or n.id != nid:
            raise IRError(f"{where}: node id mismatch or not a Node.")
        if nid in seen:
            raise IRError(f"{where}: duplicate node id.")
        if not isinstance(n.op, Op):
            raise IRError(f"{where}: unknown op {n.op!r}; the op set is {[o.value for o in Op]}.")
        lo, hi = ARITY[n.op]
        if len(n.args) < lo or (hi is not None and len(n.args) > hi):
            want = f"{lo}" if lo == hi else f"{lo}..{hi if hi is not None else 'n'}"
            raise IRError(f"{where}: {n.op.value} takes {want} argument(s); got {len(n.args)}.")
        for a in n.args:
            if a not in local:
                raise IRError(
                    f"{where}: argument %{a} is not an earlier node of the same stage "
                    "(the stage must be a DAG in topological order)."
                )
        missing = [k for k in ATTRS.get(n.op, ()) if k not in n.attrs]
        if missing:
            raise IRError(f"{where}: {n.op.value} needs attribute(s) {missing}.")
        _verify_attrs(n, where)
        if n.op in INPUTS and n.op not in STAGE_INPUTS[stage.kind]:
            raise IRError(f"{where}: the {stage.kind} stage cannot read {n.op.value} inputs.")
        if n.op == Op.OPAQUE:
            refs = [r.id for r in iter_refs(n.attrs["template"])]
            if sorted(set(refs)) != sorted(set(n.args)):
                raise IRError(
                    f"{where}: opaque template refs {refs} differ from args {list(n.args)}.")
        if annotated:
            want = _own_deps(n)
            for a in n.args:
                want |= stage.nodes[a].deps
            if n.deps != want:
                raise IRError(
                    f"{where}: domain {sorted(n.deps)} is inconsistent with its inputs "
                    f"({sorted(want)})."
                )
            if n.op == Op.LINEAR and any(stage.nodes[a].deps for a in n.args[1:]):
                raise IRError(f"{where}: linear weight/bias must not depend on rows.")
        local.add(nid)
        seen.add(nid)
    for r in iter_refs(stage.outputs):
        if r.id not in local:
            raise IRError(f"{stage.kind} stage output refers to missing node %{r.id}.")


def _verify_attrs(n: Node, where: str) -> None:
    a = n.attrs
    if n.op == Op.LEAKY_RELU and not (isinstance(a["slope"], (int, float))
                                      and math.isfinite(a["slope"])):
        raise IRError(f"{where}: leaky_relu slope must be a finite number; got {a['slope']!r}.")
    if n.op in (Op.VIEW, Op.RESHAPE, Op.EXPAND):
        vals = a["shape"] if n.op != Op.EXPAND else a["sizes"]
        if not (isinstance(vals, tuple) and all(isinstance(v, int) for v in vals)):
            raise IRError(f"{where}: {n.op.value} needs a tuple of ints; got {vals!r}.")
    if n.op in (Op.UNSQUEEZE, Op.GATHER, Op.INDEX_SELECT, Op.CAT) and not isinstance(a["dim"], int):
        raise IRError(f"{where}: {n.op.value} dim must be an int; got {a['dim']!r}.")
    if n.op == Op.PARAM and "cols" in a and not (
            isinstance(a["cols"], tuple) and len(a["cols"]) == 2
            and all(isinstance(c, int) for c in a["cols"]) and 0 <= a["cols"][0] < a["cols"][1]):
        raise IRError(f"{where}: param cols must be (start, stop) with 0 <= start < stop; "
                      f"got {a['cols']!r}.")
    if n.op == Op.PARAM and not isinstance(a["path"], str):
        raise IRError(f"{where}: param path must be a str; got {a['path']!r}.")
    if n.op == Op.OPAQUE and a["kind"] not in ("call_function", "call_method", "call_module"):
        raise IRError(f"{where}: opaque kind must be call_function/call_method/call_module.")


def _own_deps(n: Node) -> frozenset[str]:
    d = INPUT_DOMAIN.get(n.op)
    return frozenset({d}) if d else frozenset()


# ---------------------------------------------------------------------------- printing
def format_key(key: Any) -> str:
    """``("x", None)`` -> ``x``; ``("x", "h")`` -> ``x['h']``; ``("t", 0)`` -> ``t0``."""
    if isinstance(key, tuple) and len(key) == 2:
        kind, k = key
        if kind == "t":
            return f"t{k}"
        if kind == "x":
            return "x" if k is None else f"x[{k!r}]"
    return repr(key)


_INFIX = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.DIV: "/"}


def format_node(stage: Stage, nid: int, depth: int = 0) -> str:
    """A compact expression for node ``nid`` (used in explain output and reasons)."""
    n = stage.nodes[nid]
    if depth > 12:
        return "..."

    def sub(i: int) -> str:
        return format_node(stage, i, depth + 1)

    a = n.attrs
    if n.op == Op.SRC:
        return _side_name("src", a["key"])
    if n.op == Op.DST:
        return _side_name("dst", a["key"])
    if n.op == Op.EDATA:
        return "edge.data" if a["key"] is None else f"edge.data[{a['key']!r}]"
    if n.op == Op.VERTEX:
        return format_key(("x", a["key"]))
    if n.op == Op.ACC:
        return "acc" if a["key"] is None else f"acc[{a['key']!r}]"
    if n.op == Op.PARAM:
        return a["path"] + (f"[:, {a['cols'][0]}:{a['cols'][1]}]" if "cols" in a else "")
    if n.op == Op.CONST:
        v = a["value"]
        if isinstance(v, float):
            return f"{v:g}"
        return "<tensor>" if hasattr(v, "shape") else repr(v)
    if n.op == Op.LINEAR:
        if a["module"] is not None:
            return f"{a['module']}({sub(n.args[0])})"
        rest = ", ".join(sub(i) for i in n.args[1:])
        return f"linear({sub(n.args[0])}, {rest})"
    if n.op in _INFIX:
        return f"({sub(n.args[0])} {_INFIX[n.op]} {sub(n.args[1])})"
    if n.op == Op.NEG:
        return f"-{sub(n.args[0])}"
    if n.op == Op.LEAKY_RELU:
        return f"leaky_relu({sub(n.args[0])}, {a['slope']:g})"
    if n.op in UNARY:
        return f"{n.op.value}({sub(n.args[0])})"
    if n.op in (Op.VIEW, Op.RESHAPE):
        return f"{sub(n.args[0])}.{n.op.value}{tuple(a['shape'])}"
    if n.op == Op.EXPAND:
        return f"{sub(n.args[0])}.expand{tuple(a['sizes'])}"
    if n.op in (Op.UNSQUEEZE, Op.SQUEEZE):
        d = "" if a["dim"] is None else a["dim"]
        return f"{sub(n.args[0])}.{n.op.value}({d})"
    if n.op == Op.FLATTEN:
        return f"{sub(n.args[0])}.flatten({a['start']}, {a['end']})"
    if n.op in (Op.SUM, Op.MEAN):
        return f"{sub(n.args[0])}.{n.op.value}({a['dim']})"
    if n.op == Op.ROWDOT:
        return f"rowdot({sub(n.args[0])}, {sub(n.args[1])})"
    if n.op in (Op.GATHER, Op.INDEX_SELECT):
        return f"{sub(n.args[0])}.{n.op.value}({a['dim']}, {sub(n.args[1])})"
    if n.op == Op.CAT:
        return f"cat([{', '.join(sub(i) for i in n.args)}], {a['dim']})"
    # OPAQUE
    tgt = a["target"]
    name = tgt if isinstance(tgt, str) else getattr(tgt, "__name__", repr(tgt))
    if a["kind"] == "call_method":
        return f"{sub(n.args[0])}.{name}(...)" if n.args else f"{name}(...)"
    return f"{name}({', '.join(sub(i) for i in n.args)})"


def _side_name(side: str, key: Any) -> str:
    if isinstance(key, tuple) and key and key[0] == "t":
        return f"{format_key(key)}[{side}]"
    if isinstance(key, tuple) and key and key[0] == "x":
        return f"edge.{side}" if key[1] is None else f"edge.{side}[{key[1]!r}]"
    return f"{side}[{key!r}]"
