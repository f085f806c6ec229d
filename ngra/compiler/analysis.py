"""Analyses every pass relies on: shapes, domains and row-wise-ness of IR nodes.

* **Shapes** come from running the stages on a few sample rows of the real inputs
  (``SAMPLE_ROWS`` vertices/edges, cloned, under ``no_grad`` and a forked RNG).
  Random, in-place and stateful opaque calls are not run; their shapes stay unknown.
* **Domain** (``Node.deps``): which inputs a node depends on, a subset of
  ``{src, dst, edge}`` in the edge stage and ``{vertex, acc}`` in the others;
  empty for parameter/constant-only nodes.
* **Row-wise** (``Node.rowwise``): row ``i`` of the node depends only on row ``i``
  of its inputs, so computing it over vertices and then indexing equals indexing
  and then computing (the condition for hoisting out of ApplyEdge).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ngra.compiler.interp import Resolver, apply_sink, eval_node
from ngra.compiler.ir import ELEMENTWISE, INPUT_DOMAIN, INPUTS, Node, Op, Program, Stage

__all__ = ["SAMPLE_ROWS", "Samples", "annotate"]

SAMPLE_ROWS = 2
_UNKNOWN = object()


class Samples:
    """A few rows of the vertex and edge data, used to propagate shapes; on ``device`` when
    given (where the layer's parameters are: a sample op mixing devices would fail and
    leave its node without a shape, and the layer unfused)."""

    def __init__(self, x: Any, edata: Any, device: torch.device | None = None) -> None:
        self.x = _sample(x, device)
        self.edata = _sample(edata, device)


def _sample(data: Any, device: torch.device | None) -> Any:
    if data is None:
        return None
    if isinstance(data, Mapping):
        return {k: _sample(v, device) for k, v in data.items()}
    t = data.detach()
    if t.shape[0] >= SAMPLE_ROWS:
        t = t[:SAMPLE_ROWS].clone()
    else:
        t = torch.zeros((SAMPLE_ROWS,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    return t if device is None else t.to(device)


def _field(data: Any, key: Any) -> Any:
    if key is None or data is _UNKNOWN:
        return data
    return data.get(key, _UNKNOWN) if isinstance(data, Mapping) else _UNKNOWN


def annotate(program: Program, samples: Samples, resolver: Resolver) -> None:
    """Fill ``shape``/``dtype``/``deps``/``rowwise`` of every node of ``program``."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        pre_vals = _propagate(program.pre, lambda n: _field(samples.x, n.attrs["key"]), resolver)
        terms = {k: pre_vals.get(r.id, _UNKNOWN) for k, r in program.pre.outputs.items()}

        def edge_input(n: Node) -> Any:
            if n.op == Op.EDATA:
                return _UNKNOWN if samples.edata is None else _field(samples.edata, n.attrs["key"])
            return terms.get(n.attrs["key"], _UNKNOWN)

        edge_vals = _propagate(program.edge, edge_input, resolver)
        if program.vertex is not None:
            out = program.edge.outputs
            if program.gather == "softmax":
                acc: Any = edge_vals.get(out[1].id, _UNKNOWN)
            elif isinstance(out, dict):
                acc = {k: edge_vals.get(r.id, _UNKNOWN) for k, r in out.items()}
            else:
                acc = edge_vals.get(out.id, _UNKNOWN)
            if program.sink is not None and isinstance(acc, torch.Tensor):
                ones = torch.ones(acc.shape[0], dtype=torch.int64, device=acc.device)
                try:
                    acc = apply_sink(program.sink, program.gather, acc, ones, resolver)
                except Exception:  # noqa: BLE001 - no shapes for the vertex stage then
                    acc = _UNKNOWN

            def vertex_input(n: Node) -> Any:
                if n.op == Op.ACC:
                    return _field(acc, n.attrs["key"])
                return _field(samples.x, n.attrs["key"])

            _propagate(program.vertex, vertex_input, resolver, run_modules=False)
    for stage in program.stages():
        _domains(stage)


def _propagate(stage: Stage, inputs: Any, resolver: Resolver, run_modules: bool = True) -> dict:
    vals: dict[int, Any] = {}
    for nid, n in stage.nodes.items():
        args = [vals[a] for a in n.args]
        v: Any = _UNKNOWN
        if not any(a is _UNKNOWN for a in args) and _safe_to_run(n, run_modules):
            try:
                v = eval_node(n, args, inputs, resolver)
            except Exception:  # noqa: BLE001 - an op that fails on samples just has no shape
                v = _UNKNOWN
        vals[nid] = v
        if isinstance(v, torch.Tensor):
            n.shape, n.dtype = tuple(v.shape), v.dtype
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            n.shape, n.dtype = (), type(v)
        else:
            n.shape, n.dtype = None, None
    return vals


def _safe_to_run(n: Node, run_modules: bool) -> bool:
    if n.op != Op.OPAQUE:
        return True
    a = n.attrs
    if a["random"] or a["inplace"]:
        return False
    if a["kind"] == "call_module":
        # modules may keep state (batch-norm statistics): run only known stateless ones
        return run_modules and a["rowwise_ok"] is True
    return True


# ---------------------------------------------------------------------------- domains
def _domains(stage: Stage) -> None:
    for n in stage.nodes.values():
        own = INPUT_DOMAIN.get(n.op)
        deps = set() if own is None else {own}
        for a in n.args:
            deps |= stage.nodes[a].deps
        n.deps = frozenset(deps)
        n.rowwise = _rowwise(n, stage.nodes)


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _rowwise(n: Node, nodes: dict[int, Node]) -> bool:
    if n.op in INPUTS:
        return n.shape is not None and len(n.shape) >= 1
    if not n.deps or n.shape is None or len(n.shape) == 0:
        return False
    args = [nodes[a] for a in n.args]
    rowargs = [a for a in args if a.deps]
    consts = [a for a in args if not a.deps]
    if any(not a.rowwise or a.shape is None for a in rowargs):
        return False
    r = len(n.shape)
    x = args[0] if args else None
    rin = len(x.shape) if x is not None and x.shape is not None else -1
    op, at = n.op, n.attrs
    if op in ELEMENTWISE:
        return all(len(a.shape) == r for a in rowargs) and all(_over_rows(c, r) for c in consts)
    if op == Op.LINEAR:
        return bool(x.deps) and rin >= 2
    if op in (Op.VIEW, Op.RESHAPE):
        shape = at["shape"]
        return (len(shape) >= 1 and shape[0] == -1 and all(s > 0 for s in shape[1:])
                and math.prod(shape[1:]) == math.prod(x.shape[1:]))
    if op == Op.UNSQUEEZE:
        return _norm(at["dim"], rin + 1) >= 1
    if op == Op.SQUEEZE:
        return at["dim"] is not None and _norm(at["dim"], rin) >= 1
    if op == Op.FLATTEN:
        return rin >= 1 and _norm(at["start"], rin) >= 1
    if op == Op.EXPAND:
        return len(at["sizes"]) == rin and at["sizes"][0] == -1
    if op in (Op.SUM, Op.MEAN):
        dims = at["dim"]
        if dims is None:
            return False
        dims = dims if isinstance(dims, tuple) else (dims,)
        return all(_norm(d, rin) >= 1 for d in dims)
    if op == Op.ROWDOT:
        return bool(x.deps) and rin >= 2 and not args[1].deps
    if op == Op.GATHER:
        return (_norm(at["dim"], rin) >= 1 and len(rowargs) == 2
                and len(args[1].shape) == rin)
    if op == Op.INDEX_SELECT:
        return _norm(at["dim"], rin) >= 1 and not args[1].deps
    if op == Op.CAT:
        return not consts and all(len(a.shape) == r for a in rowargs) and _norm(at["dim"], r) >= 1
    if op == Op.OPAQUE:
        ok = at["rowwise_ok"]
        if ok is True:
            return True
        if isinstance(ok, tuple) and ok[0] == "dim":
            first = rowargs[0]
            return _norm(ok[1], len(first.shape)) >= 1
        if ok == "matmul":
            return (len(args) == 2 and bool(args[0].deps) and not args[1].deps
                    and rin >= 2 and args[1].shape is not None and len(args[1].shape) == 2)
    return False


def _over_rows(c: Node, rank: int) -> bool:
    """A parameter/constant broadcasts the same value to every row."""
    if c.shape is None:
        return False
    if len(c.shape) < rank:
        return True
    return len(c.shape) == rank and c.shape[0] == 1
