"""Python source for numba kernels, generated from an :class:`EdgeExpr`.

One :class:`KernelSpec` (pass kind x dtype x expression x reducer x term layout x
wanted gradients) becomes one module holding one ``@njit(nogil=True, cache=True)``
function ``kernel(..., v0, v1)`` over a range of rows, which
:func:`ngra.kernels.cpu.util.run_rows` runs on edge-balanced ranges in parallel
threads (the CPU backend's convention: a ``parallel=True``/``prange`` kernel took
2-3x longer to compile, and every cold CI run pays compile time). The expression is
inlined as straight-line scalar code in the loop over feature columns; nodes that
read only width-1 terms (and constants) are hoisted out of that loop, and
structurally equal subexpressions are computed once (derivative expressions reuse
the forward nodes, see :func:`ngra.kernels.edge_expr.derivative`).

Three pass kinds, all without atomics (each output row has exactly one writer):

``fwd``      rows = destinations; accumulates each destination's in-edges (CSC) straight
             into its output row. ``max``/``min`` also record the CSC position of the
             first edge attaining the extreme (``arg``). With ``grads`` (dst leaves;
             sum/mean only) it also sums ``d expr / d dst_i`` over the in-edges into
             ``gd<i>`` (the "dst partials" of :mod:`ngra.kernels.fused_edge`).
``bwd_dst``  rows = destinations: gradients of dst terms (summed over in-edges) and of
             edge terms (one row per edge), ``g[v] * d expr / d term``.
``bwd_src``  rows = sources, walking the reverse CSR: gradients of src terms summed over
             out-edges.
``bwd_all``  rows = sources, walking the reverse CSR: every wanted gradient in one walk, so
             the expression and its shared subexpressions are evaluated once per edge in
             backward instead of once per pass. Src gradients go to the walked row; edge
             gradients to the edge's own row; dst gradients are *added* into a per-thread
             buffer (the caller zeroes one per thread and sums them), the one output that
             several threads would otherwise write.

A spec with several ``outputs`` (``fused_edge_aggregate_multi``) writes ``out<j>`` (and
``arg<j>`` for a max/min output) in ``fwd``, and its backward kinds take ``g<j>`` per output
and add ``sum_j g<j> * d expr_j / d term`` (0 for a max/min output on an edge that did not
win its column).

Rows read at random (``src`` rows in the destination passes; ``dst``, ``g`` and
``edge`` rows in the source pass) are prefetched ``ahead`` edges ahead (an argument,
so that tuning it never needs a recompile).

Only our own IR is turned into text; no user source is ever parsed or executed.
Kernels are generated per float dtype: constants arrive as an array of the terms'
dtype, so float32 kernels stay float32, and ``exp`` and ``sigmoid`` are generated
branch-free polynomials (:func:`_exp_source`) that LLVM vectorizes across feature
columns; ``math.exp`` is a scalar libm call that blocks vectorization and
costs several times more on this machine.
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal, localcontext

from ngra.kernels._edge_spec import LEAF_ARRAY, KernelSpec
from ngra.kernels.edge_expr import EdgeExpr, topo_order

__all__ = ["KernelSpec", "generate", "exp_module", "CODEGEN_VERSION"]

# Bump when the generated text changes meaning: it is part of every kernel's file name.
CODEGEN_VERSION = "12"

_LEAF_ARRAY = LEAF_ARRAY
_LEAF_ROW = {"src": "u", "dst": "v", "edge": "e"}


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def indent(self) -> _Writer:
        self.depth += 1
        return self

    def dedent(self) -> None:
        self.depth -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class _Emitter:
    """Names every node and writes its statement, hoisted (scalar) or per column."""

    def __init__(self, spec: KernelSpec, roots: list[EdgeExpr]) -> None:
        self.wide_leaf = {(k, i): w for k, i, w in spec.layout}
        self.shared = set(spec.shared)
        self.consts: list[float] = [0.0, 1.0]
        self.names: dict[EdgeExpr, str] = {}
        self.order = topo_order(roots)
        self.wide: dict[EdgeExpr, bool] = {}
        for x in self.order:
            if x.is_leaf:
                self.wide[x] = self.wide_leaf[(x.op, x.index)]
            else:
                self.wide[x] = any(self.wide[a] for a in x.args)
        for x in self.order:
            if x.op == "const":
                self.names[x] = self.const(x.value)
            elif x.op in ("leaky_relu", "leaky_relu_grad"):
                self.const(x.value)

    def const(self, value: float) -> str:
        value = float(value)
        for k, c in enumerate(self.consts):
            # float.hex distinguishes 0.0 from -0.0
            if c.hex() == value.hex():
                return f"c{k}"
        self.consts.append(value)
        return f"c{len(self.consts) - 1}"

    def _expr(self, x: EdgeExpr) -> str:
        a = [self.names[arg] for arg in x.args]
        zero, one = "c0", "c1"
        op = x.op
        if x.is_leaf:
            arr = f"{_LEAF_ARRAY[op]}{x.index}"
            col = "f" if self.wide[x] else "0"
            row = "0" if (op, x.index) in self.shared else _LEAF_ROW[op]
            return f"{arr}[{row}, {col}]"
        if op in ("add", "sub", "mul", "div"):
            sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
            return f"{a[0]} {sym} {a[1]}"
        if op == "neg":
            return f"-{a[0]}"
        if op == "sigmoid":
            return f"_sigmoid({a[0]})"
        if op == "tanh":
            return f"math.tanh({a[0]})"
        if op == "exp":
            return f"_exp({a[0]})"
        if op == "log":
            return f"math.log({a[0]})"
        # "<= 0" rather than "> 0" so that NaN propagates as in torch
        if op == "relu":
            return f"{zero} if {a[0]} <= {zero} else {a[0]}"
        if op == "leaky_relu":
            return f"{a[0]} * {self.const(x.value)} if {a[0]} <= {zero} else {a[0]}"
        if op == "relu_grad":
            return f"{one} if {a[0]} > {zero} else {zero}"
        if op == "leaky_relu_grad":
            return f"{one} if {a[0]} > {zero} else {self.const(x.value)}"
        raise ValueError(f"no code for op {op!r}")  # pragma: no cover

    def emit(self, w: _Writer, wide: bool) -> None:
        """Statements for the hoisted (``wide=False``) or per-column nodes."""
        for x in self.order:
            if x.op == "const" or self.wide[x] != wide:
                continue
            name = f"t{len(self.names)}"
            self.names[x] = name
            w(f"{name} = {self._expr(x)}")

    def header(self, w: _Writer) -> None:
        for k in range(len(self.consts)):
            w(f"c{k} = consts[{k}]")


def generate(spec: KernelSpec) -> tuple[str, list[float]]:
    """``(module source, constants)`` for ``spec``; the module defines ``kernel``."""
    if spec.outputs:
        if spec.kind == "fwd":
            if spec.grads:
                raise ValueError(f"internal error: dst partials of a multi-output kernel: "
                                 f"{spec.grads}")
            emitter = _Emitter(spec, [x for x, _ in spec.outputs])
            body = _fwd_multi(spec, emitter)
        elif spec.kind in ("bwd_dst", "bwd_src", "bwd_all"):
            mroots = spec.multi_grad_roots()
            emitter = _Emitter(spec, [d for _, _, ds in mroots for d in ds])
            write = _bwd_dst if spec.kind == "bwd_dst" else _bwd_sources
            body = write(spec, emitter, mroots)
        else:
            raise ValueError(f"unknown kernel kind {spec.kind!r}")
    elif spec.kind == "fwd":
        roots = spec.grad_roots()
        emitter = _Emitter(spec, [spec.expr] + [r for _, _, r in roots])
        body = _fwd(spec, emitter, roots)
    elif spec.kind in ("bwd_dst", "bwd_src", "bwd_all"):
        roots = spec.grad_roots()
        emitter = _Emitter(spec, [r for _, _, r in roots])
        write = _bwd_dst if spec.kind == "bwd_dst" else _bwd_sources
        body = write(spec, emitter, roots)
    else:
        raise ValueError(f"unknown kernel kind {spec.kind!r}")
    head = spec.header("ngra.kernels.cpu._codegen", CODEGEN_VERSION) + [
        "import math",
        "",
        "import numpy as np",
        "from numba import njit",
        "",
        "from ngra.kernels.cpu.util import prefetch_row",
        *(["from ngra.kernels.cpu.fused_edge import FTZ_DAZ, mxcsr_get, mxcsr_set"]
          if spec.flush_denormals else []),
        "",
        "",
    ]
    return "\n".join(head) + _exp_source(spec.dtype) + "\n\n" + body, emitter.consts


# numba/LLVM flags of every generated function. IEEE semantics stay (no nnan/ninf:
# inf/NaN must behave as in torch); "contract" lets LLVM fuse multiply-adds.
_FASTMATH = '{"contract"}'
_DECO = f'@njit(nogil=True, cache=True, error_model="numpy", fastmath={_FASTMATH})'


def _ft(spec: KernelSpec) -> str:
    return f"np.{spec.dtype}"


def _ln2_split(dtype: str) -> tuple[float, float]:
    """``ln 2 = hi + lo`` with few bits in ``hi``, so that ``n * hi`` is exact for |n| < 2^11."""
    with localcontext() as ctx:
        ctx.prec = 60
        ln2 = Decimal(2).ln()
        keep = 12 if dtype == "float32" else 32
        m, e = math.frexp(float(ln2))
        hi = math.ldexp(math.floor(math.ldexp(m, keep)), e - keep)
        lo = float(ln2 - Decimal(hi))
    if dtype == "float32":
        lo = float(_f32(lo))
    return hi, lo


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def exp_module(dtype: str) -> str:
    """A module of only :func:`_exp_source`'s ``_exp`` and ``_sigmoid`` for ``dtype``, for
    hand-written kernels that want an ``exp`` LLVM vectorizes (the softmax aggregation's
    exponentials, :mod:`ngra.kernels.cpu.softmax_aggregate`)."""
    return ("# generated by ngra.kernels.cpu._codegen.exp_module; do not edit\n"
            "import numpy as np\nfrom numba import njit\n\n\n" + _exp_source(dtype))


def _exp_source(dtype: str) -> str:
    """A vectorizable ``exp`` for ``dtype``: ``2^n * p(r)``, ``x = n ln2 + r``, ``|r| <= ln2/2``.

    ``p`` is the Taylor polynomial of ``e^r`` (degree 7 for float32, 13 for float64:
    truncation error below half an ulp), ``2^n`` is built from its exponent bits.
    Outside the normal range the result is ``0`` or ``inf``; NaN propagates.
    """
    f32 = dtype == "float32"
    ft, it = ("np.float32", "np.int32") if f32 else ("np.float64", "np.int64")
    degree, shift, bias = (7, 23, 127) if f32 else (13, 52, 1023)
    # |n| stays inside the exponent range: n + bias in [1, 2 * bias]
    hi_x, lo_x = (88.3, -87.3) if f32 else (709.0, -708.0)
    ln2_hi, ln2_lo = _ln2_split(dtype)
    lines = [
        f"_X_HI = {ft}({hi_x!r})",
        f"_X_LO = {ft}({lo_x!r})",
        f"_LOG2E = {ft}({1.0 / math.log(2.0)!r})",
        f"_LN2_HI = {ft}({ln2_hi!r})",
        f"_LN2_LO = {ft}({ln2_lo!r})",
        f"_HALF = {ft}(0.5)",
        f"_ZERO = {ft}(0.0)",
        f"_ONE = {ft}(1.0)",
        f"_INF = {ft}(np.inf)",
        f"_BIAS = {it}({bias})",
    ]
    lines += [f"_P{k} = {ft}({1.0 / math.factorial(k)!r})" for k in range(degree + 1)]
    horner = f"_P{degree}"
    for k in range(degree - 1, -1, -1):
        horner = f"({horner}) * r + _P{k}" if k < degree - 1 else f"{horner} * r + _P{k}"
    lines += [
        "",
        "",
        # no inline="always": LLVM inlines it anyway, and numba-level inlining
        # nearly doubles the compile time of every kernel that calls it
        f'@njit(cache=True, nogil=True, error_model="numpy", fastmath={_FASTMATH})',
        "def _exp(x):  # pragma: no cover",
        "    xc = _X_LO if x < _X_LO else x",
        "    xc = _X_HI if xc > _X_HI else xc",
        "    z = np.floor(xc * _LOG2E + _HALF)  # math.floor would return an int64",
        "    r = (xc - z * _LN2_HI) - z * _LN2_LO",
        f"    p = {horner}",
        f"    y = p * {it}(({it}(z) + _BIAS) << {shift}).view({ft})",
        "    y = _INF if x > _X_HI else y",
        "    y = _ZERO if x < _X_LO else y",
        "    return x if x != x else y",
        "",
        "",
        f'@njit(cache=True, nogil=True, error_model="numpy", fastmath={_FASTMATH})',
        "def _sigmoid(x):  # pragma: no cover",
        "    # 1 / (1 + e^-x) with e^-x clamped to the normal range: beyond it sigmoid has",
        "    # saturated to 0 or 1 anyway, so the overflow/underflow fix-ups of _exp are not needed",
        "    t = _X_LO if x > -_X_LO else -x",
        "    t = _X_HI if t > _X_HI else t",
        "    z = np.floor(t * _LOG2E + _HALF)",
        "    r = (t - z * _LN2_HI) - z * _LN2_LO",
        f"    p = {horner}",
        f"    e = p * {it}(({it}(z) + _BIAS) << {shift}).view({ft})",
        "    y = _ONE / (_ONE + e)",
        "    return x if x != x else y",
    ]
    return "\n".join(lines) + "\n"


def _open_kernel(w: _Writer, spec: KernelSpec, em: _Emitter, args: list[str]) -> None:
    w(_DECO)
    w(f"def kernel({', '.join(args + ['v0', 'v1'])}):  # pragma: no cover")
    w.indent()
    if spec.flush_denormals:
        # Saturated sigmoids/exps feed subnormal products, which cost ~100 cycles each on
        # x86: flush them to zero in this thread while the kernel runs.
        w("fp_env = mxcsr_get()")
        w("mxcsr_set(fp_env | FTZ_DAZ)")
    em.header(w)


def _close_kernel(w: _Writer, spec: KernelSpec) -> str:
    w.depth = 1
    if spec.flush_denormals:
        w("mxcsr_set(fp_env)")
    return w.text()


def _zero_rows(w: _Writer, rows: list[tuple[str, str, bool]]) -> None:
    """Zero ``name[row, :]`` for wide outputs; start a scalar for narrow ones."""
    for name, row, wide in rows:
        if wide:
            w("for f in range(nf):")
            w.indent()(f"{name}[{row}, f] = c0")
            w.dedent()
        else:
            w(f"{name}_acc = c0")


def _prefetch(w: _Writer, arrays: list[str], index: str, bound: str) -> None:
    """Hint the rows ``index[pos + ahead]`` of ``arrays`` (random gathers); ``ahead`` is a
    kernel argument (:func:`ngra.kernels.cpu.util.prefetch_distance` of the gathered bytes)."""
    if not arrays:
        return
    w(f"if pos + ahead < {bound}:")
    w.indent()
    w(f"row = {index}[pos + ahead]")
    for a in arrays:
        w(f"prefetch_row({a}, row)")
    w.dedent()


def _wide_leaves(spec: KernelSpec, kind: str) -> list[str]:
    """The full-width arrays of ``kind`` read a row per edge (shared rows are not)."""
    return [f"{_LEAF_ARRAY[k]}{i}" for k, i, wd in spec.layout
            if k == kind and wd and (k, i) not in spec.shared]


def _fwd(spec: KernelSpec, em: _Emitter, roots: list[tuple[str, int, EdgeExpr]]) -> str:
    ext = spec.reduce in ("max", "min")
    if spec.grads and (ext or any(k != "dst" for k, _ in spec.grads)):
        raise ValueError(f"internal error: dst partials under {spec.reduce}: {spec.grads}")
    # the output, then the dst partials (summed, and scaled for mean, like it)
    outs = [("out", spec.expr, spec.reduce, "arg" if ext else None)]
    outs += [(name, r, spec.reduce, None) for name, (_, _, r) in zip(spec.grad_names(), roots)]
    return _fwd_walk(spec, em, outs)


def _fwd_walk(spec: KernelSpec, em: _Emitter,
              outs: list[tuple[str, EdgeExpr, str, str | None]]) -> str:
    """The ``fwd`` kernel of ``outs``, ``(array, expression, reducer, arg array of a
    max/min output or None)``: each destination's in-edges walked once, every output
    accumulated by its reducer (a max/min output also records the CSC position of the first
    edge attaining its extreme)."""
    w = _Writer()
    args = ["indptr", "indices", "consts", "ahead", *spec.arrays(), *(o[0] for o in outs)]
    _open_kernel(w, spec, em, args + [o[3] for o in outs if o[3]])
    w(f"nf = {outs[0][0]}.shape[1]")
    w("num_edges = indices.shape[0]")
    w("for v in range(v0, v1):")
    w.indent()
    w("start = indptr[v]")
    w("end = indptr[v + 1]")
    w("for f in range(nf):")
    w.indent()
    for name, _, _, _ in outs:
        w(f"{name}[v, f] = c0")
    for _, _, _, arg in outs:
        if arg:
            w(f"{arg}[v, f] = -1")
    w.dedent()
    w("for pos in range(start, end):")
    w.indent()
    _prefetch(w, _wide_leaves(spec, "src"), "indices", "num_edges")
    w("e = pos")
    w("u = indices[e]")
    em.emit(w, wide=False)
    w("for f in range(nf):")
    w.indent()
    em.emit(w, wide=True)
    for name, x, reduce, arg in outs:
        root = em.names[x]
        if arg:
            cmp = ">" if reduce == "max" else "<"
            w(f"val = {root}")
            w(f"if {arg}[v, f] < 0 or val {cmp} {name}[v, f]:")
            w.indent()
            w(f"{name}[v, f] = val")
            w(f"{arg}[v, f] = e")
            w.dedent()
        else:
            w(f"{name}[v, f] += {root}")
    w.dedent()
    w.dedent()  # edge loop
    means = [name for name, _, reduce, _ in outs if reduce == "mean"]
    if means:
        w("if end > start:")
        w.indent()
        w(f"inv = c1 / {_ft(spec)}(end - start)")
        w("for f in range(nf):")
        w.indent()
        for name in means:
            w(f"{name}[v, f] *= inv")
    return _close_kernel(w, spec)


def _grad_columns(w: _Writer, spec: KernelSpec, em: _Emitter,
                  roots: list[tuple[str, int, EdgeExpr]]) -> None:
    """The loop over feature columns of every backward kind: ``gv = g[v, f]`` (scaled for
    mean), the derivatives, and each wanted gradient added into its row (``u``, ``v``)
    or written to its edge ``e`` (a shared dst row's into row 0); width-1 terms go to a
    scalar ``<name>_acc`` that the caller opens and stores. Under max/min only the edge
    that won column ``f`` counts."""
    wide = {(k, i): wd for k, i, wd in spec.layout}
    if spec.outputs:
        _multi_grad_columns(w, spec, em, roots, wide)
        return
    w("for f in range(nf):")
    w.indent()
    if spec.reduce in ("max", "min"):
        w("if arg[v, f] != e:")
        w.indent()
        for k, i, _ in roots:
            if k == "edge" and wide[(k, i)]:
                w(f"ge{i}[e, f] = c0")
        w("continue")
        w.dedent()
    w("gv = g[v, f] * inv" if spec.reduce == "mean" else "gv = g[v, f]")
    em.emit(w, wide=True)
    for k, i, r in roots:
        _write_grad(w, spec, wide, k, i, f"gv * {em.names[r]}")
    w.dedent()


def _write_grad(w: _Writer, spec: KernelSpec, wide: dict, k: str, i: int, value: str) -> None:
    """Add an edge's ``value`` into term ``(k, i)``'s gradient: its row (``u``, ``v``; a
    shared dst row's is row 0), its edge ``e`` (written), or a width-1 term's scalar
    ``<name>_acc``."""
    name = f"g{_LEAF_ARRAY[k]}{i}"
    if not wide[(k, i)]:
        w(f"{name}_acc += {value}")
    elif k == "edge":
        w(f"{name}[e, f] = {value}")
    else:
        row = "0" if (k, i) in spec.shared else {"src": "u", "dst": "v"}[k]
        w(f"{name}[{row}, f] += {value}")


def _bwd_dst(spec: KernelSpec, em: _Emitter, roots: list[tuple[str, int, EdgeExpr]]) -> str:
    wide = {(k, i): wd for k, i, wd in spec.layout}
    gs, args = _grad_out_args(spec)
    w = _Writer()
    _open_kernel(w, spec, em, ["indptr", "indices", "consts", "ahead", *spec.arrays(), *gs]
                 + args + spec.grad_names())
    w(f"nf = {gs[0]}.shape[1]")
    w("num_edges = indices.shape[0]")
    w("for v in range(v0, v1):")
    w.indent()
    w("start = indptr[v]")
    w("end = indptr[v + 1]")
    if _has_mean(spec):
        w(f"inv = c1 / {_ft(spec)}(end - start) if end > start else c0")
    # a shared row sums over destinations (each thread its own, zeroed by the caller)
    dst = [(k, i) for k, i, _ in roots if k == "dst"
           and not (wide[(k, i)] and (k, i) in spec.shared)]
    dst_rows = [(f"gd{i}", "v", wide[(k, i)]) for k, i in dst]
    _zero_rows(w, dst_rows)
    w("for pos in range(start, end):")
    w.indent()
    _prefetch(w, _wide_leaves(spec, "src"), "indices", "num_edges")
    w("e = pos")
    w("u = indices[e]")
    em.emit(w, wide=False)
    for k, i, _ in roots:
        if k == "edge" and not wide[(k, i)]:
            w(f"ge{i}_acc = c0")
    _grad_columns(w, spec, em, roots)
    for k, i, _ in roots:
        if k == "edge" and not wide[(k, i)]:
            w(f"ge{i}[e, 0] = ge{i}_acc")
    w.dedent()  # edge loop
    for (name, row, wd), (k, i) in zip(dst_rows, dst):
        if not wd:
            w(f"{name}[0, 0] += {name}_acc" if (k, i) in spec.shared
              else f"{name}[{row}, 0] = {name}_acc")
    return _close_kernel(w, spec)


def _bwd_sources(spec: KernelSpec, em: _Emitter, roots: list[tuple[str, int, EdgeExpr]]) -> str:
    """``bwd_src`` and ``bwd_all``: rows = sources over the reverse CSR (``bwd_src`` is
    the case without dst or edge gradients)."""
    wide = {(k, i): wd for k, i, wd in spec.layout}
    gs, args = _grad_out_args(spec)
    w = _Writer()
    # dst gradients last: they are the per-thread arguments (see run_rows(per_thread=...))
    _open_kernel(w, spec, em, ["indptr", "rev_indptr", "rev_indices", "rev_perm", "consts", "ahead",
                              *spec.arrays(), *gs] + args + spec.grad_names())
    w(f"nf = {gs[0]}.shape[1]")
    w("num_edges = rev_indices.shape[0]")
    w("for u in range(v0, v1):")
    w.indent()
    src_rows = [(f"gs{i}", "u", wide[(k, i)]) for k, i, _ in roots if k == "src"]
    _zero_rows(w, src_rows)
    w("for pos in range(rev_indptr[u], rev_indptr[u + 1]):")
    w.indent()
    dst_grads = [f"gd{i}" for k, i, _ in roots
                 if k == "dst" and wide[(k, i)] and (k, i) not in spec.shared]
    _prefetch(w, _wide_leaves(spec, "dst") + gs + dst_grads, "rev_indices", "num_edges")
    _prefetch(w, _wide_leaves(spec, "edge"), "rev_perm", "num_edges")
    w("v = rev_indices[pos]")
    w("e = rev_perm[pos]")
    if _has_mean(spec):
        w(f"inv = c1 / {_ft(spec)}(indptr[v + 1] - indptr[v])")  # v has this in-edge: degree >= 1
    em.emit(w, wide=False)
    narrow = [(k, i) for k, i, _ in roots if k != "src" and not wide[(k, i)]]
    for k, i in narrow:
        w(f"g{_LEAF_ARRAY[k]}{i}_acc = c0")
    _grad_columns(w, spec, em, roots)
    for k, i in narrow:
        name = f"g{_LEAF_ARRAY[k]}{i}"
        row = "e" if k == "edge" else "0" if (k, i) in spec.shared else "v"
        w(f"{name}[{row}, 0] {'=' if k == 'edge' else '+='} {name}_acc")
    w.dedent()  # edge loop
    for name, row, wd in src_rows:
        if not wd:
            w(f"{name}[{row}, 0] = {name}_acc")
    return _close_kernel(w, spec)


# ---------------------------------------------------------------- several outputs
def _grad_out_args(spec: KernelSpec) -> tuple[list[str], list[str]]:
    """``(output gradients, arg-extreme arrays)`` a backward kernel takes: ``g`` (and
    ``arg`` under max/min) for one output; ``g<j>`` per output and ``arg<j>`` per max/min
    output ``j`` for several."""
    if not spec.outputs:
        return ["g"], (["arg"] if spec.reduce in ("max", "min") else [])
    return ([f"g{j}" for j in range(len(spec.outputs))],
            [f"arg{j}" for j, (_, r) in enumerate(spec.outputs) if r in ("max", "min")])


def _has_mean(spec: KernelSpec) -> bool:
    return any(r == "mean" for _, r in spec.roots())


def _fwd_multi(spec: KernelSpec, em: _Emitter) -> str:
    """``fwd`` of several outputs (``out<j>``, ``arg<j>`` for a max/min output ``j``)."""
    return _fwd_walk(spec, em, [(f"out{j}", x, r, f"arg{j}" if r in ("max", "min") else None)
                                for j, (x, r) in enumerate(spec.outputs)])


def _multi_grad_columns(w: _Writer, spec: KernelSpec, em: _Emitter,
                        roots: list[tuple[str, int, tuple[EdgeExpr, ...]]],
                        wide: dict) -> None:
    """:func:`_grad_columns` of several outputs: a term's gradient on an edge is
    ``sum_j gv_j * d expr_j / d term``, ``gv_j`` output ``j``'s gradient (scaled for mean;
    0 under max/min unless the edge won column ``f``)."""
    w("for f in range(nf):")
    w.indent()
    for j, (_, r) in enumerate(spec.outputs):
        if r == "mean":
            w(f"gv{j} = g{j}[v, f] * inv")
        elif r == "sum":
            w(f"gv{j} = g{j}[v, f]")
        else:
            w(f"gv{j} = g{j}[v, f] if arg{j}[v, f] == e else c0")
    em.emit(w, wide=True)
    for k, i, ds in roots:
        parts = [f"gv{j} * {em.names[d]}" for j, d in enumerate(ds)
                 if not (d.op == "const" and d.value == 0.0)]
        _write_grad(w, spec, wide, k, i, " + ".join(parts) if parts else "c0")
    w.dedent()
