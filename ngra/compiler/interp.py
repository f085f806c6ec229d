"""The reference interpreter: executes stage IR with plain torch.

This is the living definition of every :class:`~ngra.compiler.ir.Op`: running a
traced stage here gives what calling the UDF gives (tested). Compiled plans use it
for the parts that are not lowered to a kernel (vertex-side ``pre`` and ``post``
work, per-edge factors of a g-SpMM, unfused edge stages).

Parameters and submodules are looked up on the layer at run time, never snapshotted.

Element-wise ops run in place where nothing can tell: on a tensor this evaluation
made with an op whose backward does not read its output (a Linear, an add, ...), whose
only reader is the op at hand, which is no stage output. ``tanh(h(x) + acc)`` then
allocates one ``[N, F]`` tensor instead of three; autograd sees the same values
(an in-place ``mul``/``div`` only where the other operand needs no gradient, whose
backward would read the overwritten value).
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ngra.compiler.ir import Node, Op, Stage, map_refs
from ngra.kernels import sparse_input
from ngra.kernels.lean import broadcast_shape
from ngra.kernels.rowdot import rowdot

__all__ = ["Resolver", "run_stage", "evaluate", "apply_sink"]


class Resolver:
    """Finds layer tensors and submodules by dotted path at run time.

    Holds the layer weakly: plans are cached beside the layer and must not keep it alive.
    """

    def __init__(self, layer: torch.nn.Module) -> None:
        self._ref = weakref.ref(layer)

    @property
    def layer(self) -> torch.nn.Module:
        layer = self._ref()
        if layer is None:  # pragma: no cover - plans are only used through their layer
            raise RuntimeError("the layer this plan was compiled for no longer exists.")
        return layer

    def param(self, path: str) -> Any:
        obj: Any = self.layer
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj

    def module(self, path: str) -> torch.nn.Module:
        return self.layer.get_submodule(path)


def run_stage(stage: Stage, inputs: Callable[[Node], Any], resolver: Resolver,
              preset: dict[int, Any] | None = None, owned: bool = False) -> Any:
    """Execute ``stage``; returns its output structure with values in place of refs.
    ``preset`` gives the values of some nodes, computed elsewhere (``owned``: fresh
    tensors no backward reads, which this stage may overwrite like its own)."""
    env = evaluate(stage, stage.output_ids(), inputs, resolver, preset, owned)
    return map_refs(stage.outputs, lambda r: env[r.id])


def evaluate(stage: Stage, roots: list[int], inputs: Callable[[Node], Any],
             resolver: Resolver, preset: dict[int, Any] | None = None,
             owned_preset: bool = False) -> dict[int, Any]:
    """Values of ``roots`` and of every node they read (only those are computed; nodes in
    ``preset`` take its values, which may be overwritten where ``owned_preset``)."""
    env: dict[int, Any] = dict(preset or {})
    order = stage.ancestors(roots)
    readers = {nid: 0 for nid in order}
    for nid in order:
        for a in stage.nodes[nid].args:
            readers[a] += 1
    for r in roots:
        readers[r] += 1  # an output is read after the stage
    # fresh tensors made here (or handed over) that no one else reads
    owned: set[int] = {k for k, v in env.items() if isinstance(v, torch.Tensor)} \
        if owned_preset else set()
    for nid in order:
        if nid not in env:
            n = stage.nodes[nid]
            vals = [env[a] for a in n.args]
            ours = [a in owned and readers[a] == 1 for a in n.args]
            out = _in_place(n.op, vals, ours) if any(ours) else None
            env[nid] = eval_node(n, vals, inputs, resolver) if out is None else out
            if n.op in _FRESH and isinstance(env[nid], torch.Tensor):
                owned.add(nid)
    return env


#: ops whose result is a new tensor their backward does not read
_FRESH = frozenset({Op.LINEAR, Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.NEG})
_UNARY_IN_PLACE = {Op.TANH: torch.Tensor.tanh_, Op.SIGMOID: torch.Tensor.sigmoid_,
                   Op.RELU: torch.Tensor.relu_, Op.NEG: torch.Tensor.neg_}
_BINARY_IN_PLACE = {Op.ADD: torch.Tensor.add_, Op.SUB: torch.Tensor.sub_,
                    Op.MUL: torch.Tensor.mul_, Op.DIV: torch.Tensor.div_}


def _in_place(op: Op, vals: list[Any], ours: list[bool]) -> Any:
    """``op`` computed in place over an operand in ``vals`` that ``ours`` marks as
    this evaluation's to overwrite, or ``None`` where that would change a result or
    a gradient (shape or dtype would change, or the backward reads the operand)."""
    if op in _UNARY_IN_PLACE:
        return _UNARY_IN_PLACE[op](vals[0]) if vals[0].is_floating_point() else None
    if op not in _BINARY_IN_PLACE:
        return None
    x, y = vals
    for keep, other, swap in ((ours[0], y, False), (ours[1], x, True)):
        if not keep or (swap and op in (Op.SUB, Op.DIV)):
            continue
        target = y if swap else x
        if isinstance(other, torch.Tensor):
            if op in (Op.MUL, Op.DIV) and other.requires_grad and torch.is_grad_enabled():
                continue  # its gradient reads the value we would overwrite
            if (broadcast_shape(target.shape, other.shape) != target.shape
                    or torch.result_type(target, other) != target.dtype):
                continue
        elif not target.is_floating_point():
            continue
        return _BINARY_IN_PLACE[op](target, other)
    return None


def eval_node(n: Node, vals: list[Any], inputs: Callable[[Node], Any], resolver: Resolver) -> Any:
    """One node's value from its arguments' values."""
    op, a = n.op, n.attrs
    if op in (Op.SRC, Op.DST, Op.EDATA, Op.VERTEX, Op.ACC):
        return inputs(n)
    if op == Op.PARAM:
        return _param(a, resolver)
    if op == Op.CONST:
        return a["value"]
    if op == Op.OPAQUE:
        env = dict(zip(n.args, vals))
        args, kwargs = map_refs(a["template"], lambda r: env[r.id])
        kind, target = a["kind"], a["target"]
        if kind == "call_function":
            return target(*args, **kwargs)
        if kind == "call_method":
            self_obj, *rest = args
            return getattr(self_obj, target)(*rest, **kwargs)
        return resolver.module(target)(*args, **kwargs)
    return _EVAL[op](a, *vals)


def _linear(a: dict, x: Any, w: Any, b: Any = None) -> Any:
    return sparse_input.linear(x, w, b)  # F.linear, or a CSR copy of mostly-zero inputs


def _param(a: dict, resolver: Resolver) -> Any:
    v = resolver.param(a["path"])
    if "cols" in a:  # a column block (the split pass)
        v = v[:, a["cols"][0]:a["cols"][1]]
    return v


def apply_sink(sink: dict, gather: str, acc: Any, in_degree: Any, resolver: Resolver) -> Any:
    """The Linear the sink pass moved after the gather, applied to the accumulator:
    ``acc @ W.T + deg * b`` (sum) or ``+ [deg > 0] * b`` (mean)."""
    out = F.linear(acc, _param(sink["weight"], resolver))
    if sink["bias"] is not None:
        d = in_degree.to(out.dtype) if gather == "sum" else (in_degree > 0).to(out.dtype)
        out = out + d.view((-1,) + (1,) * (out.dim() - 1)) * _param(sink["bias"], resolver)
    return out


def _sum(a: dict, x: Any) -> Any:
    if a["dim"] is None:
        return x.sum()
    return x.sum(a["dim"], keepdim=a["keepdim"])


def _mean(a: dict, x: Any) -> Any:
    if a["dim"] is None:
        return x.mean()
    return x.mean(a["dim"], keepdim=a["keepdim"])


def _squeeze(a: dict, x: Any) -> Any:
    return x.squeeze() if a["dim"] is None else x.squeeze(a["dim"])


_EVAL: dict[Op, Callable[..., Any]] = {
    Op.LINEAR: _linear,
    # operator.* (not torch.*) so that Python numbers on either side behave as in the UDF
    Op.ADD: lambda a, x, y: operator.add(x, y),
    Op.SUB: lambda a, x, y: operator.sub(x, y),
    Op.MUL: lambda a, x, y: operator.mul(x, y),
    Op.DIV: lambda a, x, y: operator.truediv(x, y),
    Op.NEG: lambda a, x: operator.neg(x),
    Op.SIGMOID: lambda a, x: torch.sigmoid(x),
    Op.TANH: lambda a, x: torch.tanh(x),
    Op.RELU: lambda a, x: torch.relu(x),
    Op.LEAKY_RELU: lambda a, x: F.leaky_relu(x, a["slope"]),
    Op.EXP: lambda a, x: torch.exp(x),
    Op.LOG: lambda a, x: torch.log(x),
    Op.VIEW: lambda a, x: x.view(*a["shape"]),
    Op.RESHAPE: lambda a, x: x.reshape(*a["shape"]),
    Op.UNSQUEEZE: lambda a, x: x.unsqueeze(a["dim"]),
    Op.SQUEEZE: _squeeze,
    Op.FLATTEN: lambda a, x: x.flatten(a["start"], a["end"]),
    Op.EXPAND: lambda a, x: x.expand(*a["sizes"]),
    Op.SUM: _sum,
    Op.MEAN: _mean,
    Op.ROWDOT: lambda a, x, w: rowdot(x, w),
    Op.GATHER: lambda a, x, idx: torch.gather(x, a["dim"], idx),
    Op.INDEX_SELECT: lambda a, x, idx: torch.index_select(x, a["dim"], idx),
    Op.CAT: lambda a, *xs: torch.cat(list(xs), a["dim"]),
}

# Every op the IR knows is either an input/leaf/opaque or has an implementation here.
assert set(_EVAL) | {Op.SRC, Op.DST, Op.EDATA, Op.VERTEX, Op.ACC, Op.PARAM, Op.CONST,
                     Op.OPAQUE} == set(Op)
