"""Triton source for fused edge kernels, generated from the same
:class:`~ngra.kernels._edge_spec.KernelSpec` the numba backend generates from.

One spec becomes one module holding one autotuned ``@triton.jit`` function ``kernel``.
A program owns one row (a destination, or a source for ``bwd_src``) and all ``F``
columns (``BLOCK_F`` = the next power of two), and walks the row's edges in blocks of
``BLOCK_E``: each node of the expression is a ``[BLOCK_E, BLOCK_F]`` tile, or narrower
where its leaves are (``[BLOCK_E, 1]`` for width-1 edge-side terms, ``[1, BLOCK_F]`` /
``[1, 1]`` for the row's own terms), and is reduced into registers, so no per-edge
value reaches memory. Nodes that read only the row's own terms (and constants) are
computed once, before the edge loop. Structurally equal subexpressions are computed
once (derivative expressions reuse the forward's nodes).

Three pass kinds, each output row with one writer (no atomics):

``fwd``      rows = destinations (CSC): the reduction of the expression (``max``/``min``
             also record the CSC position of the first extreme edge, ``arg``); with
             ``grads`` (dst leaves, sum/mean) it also sums ``d expr / d dst_i`` into
             ``gd<i>`` (the "dst partials" of :mod:`ngra.kernels.fused_edge`).
``bwd_dst``  rows = destinations: gradients of dst terms (summed over in-edges) and of
             edge terms (written per edge).
``bwd_src``  rows = sources over the reverse CSR: gradients of src terms.

Constants are ``tl.full`` tiles of the terms' dtype (a bare Python float would be
float32 in a float64 kernel). Only our own IR is turned into text.
"""

from __future__ import annotations

from ngra.kernels._edge_spec import LEAF_ARRAY, KernelSpec
from ngra.kernels.edge_expr import EdgeExpr, topo_order

__all__ = ["CODEGEN_VERSION", "generate", "kernel_args"]

# Bump when the generated text changes meaning: it is part of every kernel's file name.
CODEGEN_VERSION = "1"

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def kernel_args(spec: KernelSpec) -> list[str]:
    """The generated kernel's tensor arguments, in order (the launcher passes them by name)."""
    ext = spec.reduce in ("max", "min")
    if spec.kind == "fwd":
        rows = ["rowptr", "idx"]
        outs = ["out"] + (["arg"] if ext else spec.grad_names())
        return rows + spec.arrays() + outs
    if spec.kind == "bwd_dst":
        return ["rowptr", "idx"] + spec.arrays() + ["g"] + (["arg"] if ext else []) \
            + spec.grad_names()
    if spec.kind == "bwd_src":
        return ["rowptr", "idx", "eperm", "indptr"] + spec.arrays() + ["g"] \
            + (["arg"] if ext else []) + spec.grad_names()
    raise ValueError(f"the Triton target has no kernel kind {spec.kind!r}")


class _Emitter:
    """Names every node and writes its statements, before the edge loop (invariant) or
    inside it."""

    def __init__(self, spec: KernelSpec, roots: list[EdgeExpr]) -> None:
        self.spec = spec
        self.dt = f"tl.{spec.dtype}"
        self.row_kind = "src" if spec.kind == "bwd_src" else "dst"
        self.wide = {(k, i): w for k, i, w in spec.layout}
        self.order = topo_order(roots)
        self.names: dict[EdgeExpr, str] = {}
        self.invariant: dict[EdgeExpr, bool] = {}
        for x in self.order:
            if x.is_leaf:
                self.invariant[x] = x.op == self.row_kind
            else:
                self.invariant[x] = all(self.invariant[a] for a in x.args)
        self.consts: dict[str, str] = {}

    def const(self, value: float) -> str:
        key = float(value).hex()  # distinguishes 0.0 from -0.0
        if key not in self.consts:
            self.consts[key] = f"c{len(self.consts)}"
        return self.consts[key]

    def const_lines(self) -> list[str]:
        return [f"{name} = tl.full([1, 1], {float.fromhex(key)!r}, {self.dt})"
                for key, name in self.consts.items()]

    def _leaf(self, x: EdgeExpr) -> str:
        arr = f"{LEAF_ARRAY[x.op]}{x.index}"
        wide = self.wide[(x.op, x.index)]
        if x.op == self.row_kind:  # the row's own term: [1, BLOCK_F] or [1, 1]
            if wide:
                return f"tl.load({arr} + row * F + cols[None, :], mask=cmask[None, :], other=0.0)"
            return f"tl.load({arr} + row + zero11)"
        ids = {"src": "u", "dst": "v", "edge": "k"}[x.op]
        if wide:
            return f"tl.load({arr} + {ids} * F + cols[None, :], mask=m2, other=0.0)"
        return f"tl.load({arr} + {ids}, mask=emask[:, None], other=0.0)"

    def _expr(self, x: EdgeExpr) -> list[str]:
        """The statements that set ``t<n>`` (the last line's target)."""
        name = f"t{len(self.names)}"
        a = [self.names[arg] for arg in x.args]
        op = x.op
        if x.is_leaf:
            body = self._leaf(x)
        elif op in _INFIX:
            body = f"{a[0]} {_INFIX[op]} {a[1]}"
        elif op == "neg":
            body = f"-{a[0]}"
        elif op in ("sigmoid", "exp", "log"):
            body = f"tl.{op}({a[0]})"
        elif op == "tanh":  # (1 - e^-2|a|) / (1 + e^-2|a|) with a's sign: no overflow
            one = self.const(1.0)
            t = f"{name}_e"
            return [f"{t} = tl.exp(-2.0 * tl.abs({a[0]}))",
                    f"{name} = tl.where({a[0]} < 0, ({t} - {one}) / ({one} + {t}), "
                    f"({one} - {t}) / ({one} + {t}))"]
        elif op == "relu":  # "<= 0", not "> 0": NaN propagates as in torch
            body = f"tl.where({a[0]} <= 0, {self.const(0.0)}, {a[0]})"
        elif op == "leaky_relu":
            body = f"tl.where({a[0]} <= 0, {a[0]} * {self.const(x.value)}, {a[0]})"
        elif op == "relu_grad":
            body = f"tl.where({a[0]} > 0, {self.const(1.0)}, {self.const(0.0)})"
        elif op == "leaky_relu_grad":
            body = f"tl.where({a[0]} > 0, {self.const(1.0)}, {self.const(x.value)})"
        else:  # pragma: no cover - verify() rejects unknown ops first
            raise ValueError(f"no code for op {op!r}")
        return [f"{name} = {body}"]

    def emit(self, invariant: bool) -> list[str]:
        lines: list[str] = []
        for x in self.order:
            if self.invariant[x] != invariant:
                continue
            if x.op == "const":
                self.names[x] = self.const(x.value)
                continue
            stmts = self._expr(x)
            self.names[x] = f"t{len(self.names)}"
            lines += stmts
        return lines


def generate(spec: KernelSpec) -> str:
    """The module source for ``spec``; it defines the autotuned ``kernel``."""
    roots = spec.grad_roots()
    ext = spec.reduce in ("max", "min")
    if spec.kind == "fwd":
        if spec.grads and (ext or any(k != "dst" for k, _ in spec.grads)):
            raise ValueError(f"internal error: dst partials under {spec.reduce}: {spec.grads}")
        em = _Emitter(spec, [spec.expr] + [r for _, _, r in roots])
    else:
        kernel_args(spec)  # rejects kinds Triton has no kernel for
        em = _Emitter(spec, [r for _, _, r in roots])
    pre = em.emit(invariant=True)
    body = em.emit(invariant=False)
    src_side = spec.kind == "bwd_src"
    lines = [
        "row = tl.program_id(0).to(tl.int64)",
        "cols = tl.arange(0, BLOCK_F)",
        "cmask = cols < F",
        "zero11 = tl.zeros([1, 1], tl.int64)",
        "start = tl.load(rowptr + row)",
        "end = tl.load(rowptr + row + 1)",
        *em.const_lines(),
        *pre,
    ]
    acc = []  # (accumulator, its tile expression, wide)
    if spec.kind == "fwd":
        acc.append(("out", em.names[spec.expr], True))
        acc += [(f"gd{i}", em.names[r], True) for _, i, r in roots]
    if spec.kind != "fwd":
        lines.append("gv = tl.load(g + row * F + cols, mask=cmask, other=0.0)[None, :]"
                     if not src_side else "")
        if spec.reduce == "mean" and not src_side:
            lines.append(f"gv = gv / tl.maximum(end - start, 1).to({em.dt})")
        if ext and not src_side:
            lines.append("ga = tl.load(arg + row * F + cols, mask=cmask, other=-1)[None, :]")
        for k, i, r in roots:
            if k != "edge":
                acc.append((f"g{LEAF_ARRAY[k]}{i}", f"gw * {em.names[r]}", em.wide[(k, i)]))
    if ext and spec.kind == "fwd":
        fill = "float('-inf')" if spec.reduce == "max" else "float('inf')"
        lines += [f"acc_out = tl.full([BLOCK_F], {fill}, {em.dt})",
                  "best = tl.full([BLOCK_F], -1, tl.int64)"]
    else:
        lines += [f"acc_{name} = tl.zeros([BLOCK_F], {em.dt})" if wide else
                  f"acc_{name} = tl.zeros([1], {em.dt})" for name, _, wide in acc]
    loop = [
        "pos = j + tl.arange(0, BLOCK_E)",
        "emask = pos < end",
        "m2 = emask[:, None] & cmask[None, :]",
    ]
    if src_side:
        loop += ["v = tl.load(idx + pos, mask=emask, other=0).to(tl.int64)[:, None]",
                 "k = tl.load(eperm + pos, mask=emask, other=0).to(tl.int64)[:, None]"]
    else:
        loop += ["u = tl.load(idx + pos, mask=emask, other=0).to(tl.int64)[:, None]",
                 "k = pos.to(tl.int64)[:, None]"]
    loop += body
    if spec.kind == "fwd":
        root = em.names[spec.expr]
        if ext:
            cmp = ">" if spec.reduce == "max" else "<"
            red = "tl.max" if spec.reduce == "max" else "tl.min"
            loop += [f"x = tl.where(m2, {root}, {fill})",
                     f"bx = {red}(x, axis=0)",
                     "first = tl.min(tl.where((x == bx[None, :]) & m2, k, end), axis=0)",
                     f"better = (bx {cmp} acc_out) | (best < 0)",
                     "acc_out = tl.where(better, bx, acc_out)",
                     "best = tl.where(better, first, best)"]
        else:
            loop += [f"acc_{name} += tl.sum(tl.where(m2, {val}, 0.0), axis=0)"
                     for name, val, _ in acc]
    else:
        if src_side:
            loop.append("gw = tl.load(g + v * F + cols[None, :], mask=m2, other=0.0)")
            if spec.reduce == "mean":
                loop.append("deg = tl.load(indptr + v + 1, mask=emask[:, None], other=1) - "
                            "tl.load(indptr + v, mask=emask[:, None], other=0)")
                loop.append(f"gw = gw / tl.maximum(deg, 1).to({em.dt})")
            if ext:
                loop.append("gw = tl.where(tl.load(arg + v * F + cols[None, :], mask=m2, "
                            "other=-1) == k, gw, 0.0)")
        else:
            loop.append("gw = tl.where(ga == k, gv, 0.0)" if ext else "gw = gv")
        for name, val, wide in acc:
            s = f"tl.sum(tl.where(m2, {val}, 0.0), axis=0)"
            loop.append(f"acc_{name} += {s}" if wide else f"acc_{name} += tl.sum({s}, axis=0)")
        for k, i, r in roots:
            if k != "edge":
                continue
            val = f"tl.where(m2, gw * {em.names[r]}, 0.0)"
            if em.wide[(k, i)]:
                loop.append(f"tl.store(ge{i} + k * F + cols[None, :], {val}, mask=m2)")
            else:
                loop.append(f"tl.store(ge{i} + k, tl.sum({val}, axis=1)[:, None], "
                            "mask=emask[:, None])")
    lines.append("for j in range(start, end, BLOCK_E):")
    lines += ["    " + s for s in loop]
    if spec.kind == "fwd":
        if ext:
            lines += ["tl.store(out + row * F + cols, tl.where(best < 0, 0.0, acc_out), "
                      "mask=cmask)",
                      "tl.store(arg + row * F + cols, best, mask=cmask)"]
        else:
            if spec.reduce == "mean":
                lines.append(f"inv = 1.0 / tl.maximum(end - start, 1).to({em.dt})")
            scale = " * inv" if spec.reduce == "mean" else ""
            lines += [f"tl.store({name} + row * F + cols, acc_{name}{scale}, mask=cmask)"
                      for name, _, _ in acc]
    else:
        for name, _, wide in acc:
            lines.append(f"tl.store({name} + row * F + cols, acc_{name}, mask=cmask)" if wide
                         else f"tl.store({name} + row + tl.arange(0, 1), acc_{name})")
    args = kernel_args(spec)
    head = spec.header("ngra.kernels.gpu._codegen", CODEGEN_VERSION) + [
        "import triton",
        "import triton.language as tl",
        "",
        "from ngra.kernels.gpu.util import EDGE_CONFIGS, autotune",
        "",
        "",
        '@autotune(EDGE_CONFIGS, key=["F", "AVG_DEG"])',
        "@triton.jit",
        f"def kernel({', '.join(args)}, F, AVG_DEG, BLOCK_E: tl.constexpr, "
        "BLOCK_F: tl.constexpr):",
    ]
    return "\n".join(head + ["    " + s if s else "" for s in lines]) + "\n"
