"""Tracing: ``apply_edge`` / ``apply_vertex`` -> stage IR, with torch.fx.

The UDFs are run once with proxies (``edge.src``, ``edge.dst``, ``edge.data`` and
``vertex``/``acc``; a dict of vertex or edge data becomes a dict of proxies). A
custom :class:`SagaTracer` keeps every ``torch.nn`` module call, ``nn.Sequential``
included, as one ``call_module`` node; user-defined submodules are traced through.
Each fx node then becomes IR: known torch calls map to the closed op set (an
``nn.Sequential`` of Linear and activation modules is inlined, one node per
child), anything else to an ``OPAQUE`` node that still executes.

A program that cannot be traced (data-dependent control flow, iteration over a
proxy, unsupported Python) raises :class:`TraceFailure` with the reason; the
compiler then runs it on the generic executor.
"""

from __future__ import annotations

import builtins
import operator
import threading
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ngra.compiler.ir import Node, Op, Program, Ref, Stage, format_node
from ngra.edge import Edge

__all__ = ["SagaTracer", "TraceFailure", "trace_program", "trace_vertex", "structure_of"]


class TraceFailure(Exception):
    """A UDF could not be traced; ``str(exc)`` is the reason shown by explain."""


class SagaTracer(fx.Tracer):
    """fx tracer that keeps every ``torch.nn`` module (``nn.Sequential`` too) as a leaf.

    While it traces, torch.fx patches ``torch.nn.Module.__call__`` and ``__getattr__`` for
    the whole process, so a module called by another thread meanwhile (a layer already
    compiled, a plain ``nn.Linear``) reaches this tracer: such calls and attribute reads
    run as if nothing were traced (only the tracing thread records nodes).
    """

    proxy_buffer_attributes = True

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.get_ident()

    def _foreign(self) -> bool:
        return threading.get_ident() != self._thread

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        mod = type(m).__module__
        return mod.startswith("torch.nn") or mod.startswith("torch.ao.nn")

    def call_module(self, m: nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        if self._foreign():
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict) -> Any:
        if self._foreign():
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)


# ---------------------------------------------------------------------------- structures
_NONE = "none"  # edge data absent


def structure_of(data: Any) -> Any:
    """``None`` for a tensor, ``"none"`` for no data, else the dict's keys (a tuple)."""
    if data is None:
        return _NONE
    if isinstance(data, Mapping):
        return tuple(data.keys())
    return None


def _unpack(proxy: Any, keys: Any) -> Any:
    if keys == _NONE:
        return None
    if keys is None:
        return proxy
    return {k: proxy[k] for k in keys}


class _EdgeRoot(nn.Module):
    def __init__(self, layer: nn.Module, x_keys: Any, e_keys: Any) -> None:
        super().__init__()
        self.layer = layer
        self._x_keys, self._e_keys = x_keys, e_keys

    def forward(self, src, dst, data):  # noqa: D102 - traced, never called eagerly
        edge = Edge(_unpack(src, self._x_keys), _unpack(dst, self._x_keys), None, None,
                    _unpack(data, self._e_keys))
        return self.layer.apply_edge(edge)


class _VertexRoot(nn.Module):
    def __init__(self, layer: nn.Module, x_keys: Any, acc_keys: Any) -> None:
        super().__init__()
        self.layer = layer
        self._x_keys, self._acc_keys = x_keys, acc_keys

    def forward(self, vertex, acc):  # noqa: D102
        return self.layer.apply_vertex(_unpack(vertex, self._x_keys), _unpack(acc, self._acc_keys))


def _fx_trace(root: nn.Module, what: str) -> tuple[fx.Graph, SagaTracer]:
    tracer = SagaTracer()
    with torch.random.fork_rng(devices=[]):
        state = torch.get_rng_state()
        try:
            graph = tracer.trace(root)
        except fx.proxy.TraceError as exc:
            raise TraceFailure(f"{what} has data-dependent control flow ({exc})") from exc
        except Exception as exc:  # noqa: BLE001 - any failure means: run the UDF as is
            raise TraceFailure(f"{what} could not be traced: {type(exc).__name__}: {exc}") from exc
        if not torch.equal(state, torch.get_rng_state()):
            raise TraceFailure(
                f"{what} drew random numbers while being traced (a random op with constant "
                "arguments); it must run as written"
            )
    return graph, tracer


def trace_program(layer: nn.Module, x: Any, edata: Any) -> Program:
    """Trace ``layer.apply_edge`` into a program (:func:`trace_vertex` adds the vertex stage).

    Raises:
        TraceFailure: apply_edge cannot be traced or returns something unusable.
    """
    x_keys, e_keys = structure_of(x), structure_of(edata)
    program = Program(type(layer).__name__, layer.gather, Stage("pre"), Stage("edge"), None)
    # pre: the identity on the vertex data, one term per vertex field
    terms = {}
    for k in ((None,) if x_keys is None else x_keys):
        nid = program.new_id()
        program.pre.add(Node(nid, Op.VERTEX, (), {"key": k}, name=f"x_{k}" if k else "x"))
        terms[("x", k)] = Ref(nid)
        program.terms[("x", k)] = {"origin": "input"}
    program.pre.outputs = terms
    graph, tracer = _fx_trace(_EdgeRoot(layer, x_keys, e_keys),
                              f"{type(layer).__name__}.apply_edge")
    conv = _Converter(program, program.edge, tracer,
                      {"src": Op.SRC, "dst": Op.DST, "data": Op.EDATA},
                      {"src": x_keys, "dst": x_keys, "data": e_keys})
    program.edge.outputs = conv.run(graph)
    _check_messages(program)
    _note_as_written(program, program.edge, "apply_edge")
    program.edge.prune()
    return program


def trace_vertex(program: Program, layer: nn.Module, x: Any) -> None:
    """Trace ``layer.apply_vertex`` into ``program.vertex`` (raises :class:`TraceFailure`)."""
    out = program.edge.outputs
    acc_keys = tuple(out.keys()) if isinstance(out, dict) else None
    graph, tracer = _fx_trace(_VertexRoot(layer, structure_of(x), acc_keys),
                              f"{type(layer).__name__}.apply_vertex")
    stage = Stage("vertex")
    conv = _Converter(program, stage, tracer, {"vertex": Op.VERTEX, "acc": Op.ACC},
                      {"vertex": structure_of(x), "acc": acc_keys})
    stage.outputs = conv.run(graph)
    # anything else runs as written, where the plan's post names it (check_vertex_output)
    _check_tensors(stage.outputs, f"{type(layer).__name__}.apply_vertex")
    _note_as_written(program, stage, "apply_vertex")
    stage.prune()
    program.vertex = stage


def _note_as_written(program: Program, stage: Stage, what: str) -> None:
    """Record why ``stage`` must run as written (random or in-place calls), if it must."""
    for n in stage.nodes.values():
        if n.op != Op.OPAQUE or not (n.attrs["random"] or n.attrs["inplace"]):
            continue
        t = n.attrs["target"]
        name = t if isinstance(t, str) else getattr(t, "__name__", repr(t))
        if n.attrs["random"]:
            why = f"{what} calls a random op ({name})"
            if stage.kind == "edge":
                why += ": per-edge randomness cannot be hoisted or fused"
            why += f", so it runs as written: {format_node(stage, n.id)}"
        else:
            why = f"{what} modifies a tensor in place ({name}); it runs as written"
        program.as_written[stage.kind] = why
        return


def _check_messages(program: Program) -> None:
    out, name = program.edge.outputs, f"{program.layer_name}.apply_edge"
    if program.gather == "softmax":
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(o, Ref) for o in out)):
            raise TraceFailure(f"{name} must return (score, value) with gather='softmax'")
        return
    _check_tensors(out, name)


def _check_tensors(out: Any, name: str) -> None:
    if isinstance(out, Ref):
        return
    if isinstance(out, dict) and out and all(isinstance(o, Ref) for o in out.values()):
        return
    raise TraceFailure(
        f"{name} must return a tensor or a dict of tensors; got {type(out).__name__}")


# ---------------------------------------------------------------------------- fx -> IR
_RANDOM_FUNCS = {
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
    F.rrelu, F.gumbel_softmax, torch.dropout, torch.bernoulli, torch.rand, torch.rand_like,
    torch.randn, torch.randn_like, torch.randint, torch.randint_like, torch.normal,
    torch.multinomial, torch.randperm, torch.poisson,
}
_RANDOM_METHODS = {"bernoulli", "bernoulli_", "uniform_", "normal_", "random_", "exponential_",
                   "geometric_", "cauchy_", "log_normal_", "multinomial"}
_RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                   nn.FeatureAlphaDropout, nn.RReLU)

# Known to compute row i of the output from row i of the inputs (when their dim
# arguments, if any, are not the row dim): safe to move to the vertex side.
_ROWWISE_FUNCS = {
    F.elu, F.selu, F.celu, F.gelu, F.silu, F.mish, F.softplus, F.softsign, F.hardtanh, F.relu6,
    F.logsigmoid, F.hardswish, F.hardsigmoid, F.tanhshrink, F.layer_norm, torch.abs, torch.sqrt,
    torch.rsqrt, torch.square, torch.pow, torch.clamp, torch.clip, torch.sin, torch.cos,
    torch.erf, torch.sign, operator.pow, torch.exp2, torch.log1p, torch.expm1,
}
_ROWWISE_DIM_FUNCS = {F.softmax: 1, F.log_softmax: 1, F.normalize: 2}  # fn -> dim arg position
_ROWWISE_METHODS = {
    "abs", "sqrt", "rsqrt", "square", "pow", "clamp", "clip", "float", "double", "half", "to",
    "type_as", "contiguous", "clone", "sin", "cos", "erf", "sign", "log1p", "expm1", "detach",
}
_ROWWISE_DIM_METHODS = {"softmax": 0, "log_softmax": 0}
_ROWWISE_MODULES = (
    nn.Identity, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Softsign, nn.Hardtanh, nn.Hardswish,
    nn.Hardsigmoid, nn.PReLU, nn.Tanhshrink, nn.LogSigmoid, nn.LayerNorm, nn.Linear, nn.GRUCell,
    nn.LSTMCell, nn.RNNCell,
)

_UNARY_FUNCS = {
    torch.sigmoid: Op.SIGMOID, F.sigmoid: Op.SIGMOID, torch.tanh: Op.TANH, F.tanh: Op.TANH,
    torch.relu: Op.RELU, F.relu: Op.RELU, torch.exp: Op.EXP, torch.log: Op.LOG,
    torch.neg: Op.NEG, operator.neg: Op.NEG, torch.negative: Op.NEG,
}
_UNARY_METHODS = {"sigmoid": Op.SIGMOID, "tanh": Op.TANH, "relu": Op.RELU, "exp": Op.EXP,
                  "log": Op.LOG, "neg": Op.NEG, "negative": Op.NEG}
_BINARY_FUNCS = {
    operator.add: Op.ADD, torch.add: Op.ADD, operator.sub: Op.SUB, torch.sub: Op.SUB,
    torch.subtract: Op.SUB, operator.mul: Op.MUL, torch.mul: Op.MUL, torch.multiply: Op.MUL,
    operator.truediv: Op.DIV, torch.div: Op.DIV, torch.true_divide: Op.DIV, torch.divide: Op.DIV,
}
_BINARY_METHODS = {"add": Op.ADD, "sub": Op.SUB, "subtract": Op.SUB, "mul": Op.MUL,
                   "multiply": Op.MUL, "div": Op.DIV, "true_divide": Op.DIV, "divide": Op.DIV}
_ACT_MODULES = {nn.ReLU: Op.RELU, nn.Sigmoid: Op.SIGMOID, nn.Tanh: Op.TANH}


def _bind(args: tuple, kwargs: dict, names: tuple[str, ...], defaults: dict) -> dict | None:
    """Positional + keyword arguments -> ``{name: value}``; ``None`` if they do not fit."""
    if len(args) > len(names) or any(k not in names for k in kwargs):
        return None
    out = dict(defaults)
    out.update(zip(names, args))
    for k, v in kwargs.items():
        if k in names[: len(args)]:
            return None
        out[k] = v
    if any(n not in out for n in names):
        return None
    return out


def _has_node(v: Any) -> bool:
    if isinstance(v, fx.Node):
        return True
    if isinstance(v, (tuple, list)):
        return any(_has_node(x) for x in v)
    if isinstance(v, dict):
        return any(_has_node(x) for x in v.values())
    if isinstance(v, slice):
        return any(_has_node(x) for x in (v.start, v.stop, v.step))
    return False


def _int_tuple(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, (tuple, list)) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in v):
        return tuple(v)
    return None


def _shape_args(rest: tuple) -> tuple[int, ...] | None:
    if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
        return _int_tuple(tuple(rest[0]))
    return _int_tuple(rest)


def _is_scalar(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _dim(v: Any) -> Any:
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    t = _int_tuple(v)
    return t if t else False  # False: not a usable dim


class _Converter:
    """Turns one traced fx graph into IR nodes of ``stage``."""

    def __init__(self, program: Program, stage: Stage, tracer: SagaTracer,
                 placeholders: dict[str, Op], keys: dict[str, Any]) -> None:
        self.p, self.stage, self.tracer = program, stage, tracer
        self.ph_ops = placeholders
        self.ph_keys = keys  # placeholder -> its dict keys (a tuple), or None for a tensor
        self.env: dict[fx.Node, Any] = {}
        self.inputs: dict[tuple[Op, Any], int] = {}

    # ---- helpers
    def node(self, op: Op, args: list[int], attrs: dict, name: str = "") -> int:
        nid = self.p.new_id()
        self.stage.add(Node(nid, op, tuple(args), attrs, name=name))
        return nid

    def input(self, op: Op, key: Any) -> int:
        ik = (op, key)
        if ik not in self.inputs:
            attr_key = ("x", key) if op in (Op.SRC, Op.DST) else key
            name = op.value if key is None else f"{op.value}_{key}"
            self.inputs[ik] = self.node(op, [], {"key": attr_key}, name)
        return self.inputs[ik]

    def val(self, a: Any) -> int:
        """The IR id of an fx argument (a node, or a number that becomes a CONST)."""
        if isinstance(a, fx.Node):
            v = self.env[a]
            if isinstance(v, tuple) and v[0] == "ph":
                return self.input(self.ph_ops[v[1]], None)
            return v
        if _is_scalar(a) or isinstance(a, torch.Tensor):
            return self.node(Op.CONST, [], {"value": a}, "const")
        raise TypeError(f"unsupported argument {a!r}")

    def resolve(self, a: Any) -> Any:
        """For templates: fx nodes -> Ref; everything else unchanged."""
        return fx.node.map_arg(a, lambda n: Ref(self.val(n)))

    # ---- driver
    def run(self, graph: fx.Graph) -> Any:
        for n in graph.nodes:
            if n.op == "placeholder":
                self.env[n] = ("ph", n.target)
            elif n.op == "get_attr":
                self.env[n] = self.get_attr(n)
            elif n.op == "output":
                out = n.args[0]
                return fx.node.map_arg(out, lambda m: Ref(self.val(m)))
            else:
                self.env[n] = self.call(n)
        raise TraceFailure("traced graph has no output")  # pragma: no cover

    def get_attr(self, n: fx.Node) -> int:
        target = str(n.target)
        if target.startswith("layer."):
            return self.node(Op.PARAM, [], {"path": target[len("layer."):]}, target[6:])
        value = self.tracer.root
        for part in target.split("."):
            value = getattr(value, part)
        return self.node(Op.CONST, [], {"value": value}, target)

    def call(self, n: fx.Node) -> Any:
        args, kwargs, target = n.args, dict(n.kwargs), n.target
        if n.op == "call_function" and target is operator.getitem:
            base = args[0]
            ph = self.env.get(base) if isinstance(base, fx.Node) else None
            if isinstance(ph, tuple) and ph[0] == "ph":
                keys = self.ph_keys.get(ph[1])
                if isinstance(keys, tuple) and not _has_node(args[1]) and args[1] in keys:
                    return self.input(self.ph_ops[ph[1]], args[1])
        lowered = None
        if n.op == "call_function":
            lowered = self.function(target, args, kwargs)
        elif n.op == "call_method":
            lowered = self.method(target, args, kwargs)
        elif n.op == "call_module":
            lowered = self.module(target, args, kwargs)
        if lowered is not None:
            if isinstance(lowered, int):  # pass-through (identity)
                return lowered
            op, fx_args, attrs = lowered
            return self.node(op, [self.val(a) for a in fx_args], attrs, n.name)
        return self.opaque(n)

    def opaque(self, n: fx.Node) -> int:
        args, kwargs, target = n.args, dict(n.kwargs), n.target
        template = (self.resolve(tuple(args)), self.resolve(kwargs))
        refs = []
        for arg in (template[0], template[1]):
            fx.node.map_aggregate(arg, lambda v: refs.append(v.id) if isinstance(v, Ref) else None)
        random = inplace = False
        rowwise: Any = False
        name = target if isinstance(target, str) else getattr(target, "__name__", "")
        if kwargs.get("inplace") is True:
            inplace = True
        if n.op == "call_function":
            random = target in _RANDOM_FUNCS
            inplace = inplace or (name.endswith("_") and not name.startswith("__"))
            if target in _ROWWISE_FUNCS:
                rowwise = True
            elif target in _ROWWISE_DIM_FUNCS:
                pos = _ROWWISE_DIM_FUNCS[target]
                d = kwargs.get("dim", args[pos] if len(args) > pos else None)
                rowwise = ("dim", d) if isinstance(d, int) else False
            elif target in (operator.matmul, torch.matmul):
                rowwise = "matmul"
            elif target is operator.getitem and isinstance(args[1], tuple) and args[1] \
                    and args[1][0] == slice(None) and not _has_node(args[1]):
                rowwise = True
            elif target is builtins.getattr:
                rowwise = False
        elif n.op == "call_method":
            random = target in _RANDOM_METHODS
            inplace = inplace or (target.endswith("_") and not target.startswith("__"))
            if target in _ROWWISE_METHODS:
                rowwise = True
            elif target in _ROWWISE_DIM_METHODS:
                d = kwargs.get("dim", args[1] if len(args) > 1 else None)
                rowwise = ("dim", d) if isinstance(d, int) else False
        else:
            mod = self.tracer.root.get_submodule(target)
            random = _module_is_random(mod)
            inplace = inplace or _module_is_inplace(mod)
            rowwise = _module_is_rowwise(mod)
            target = target[len("layer."):] if target.startswith("layer.") else target
        return self.node(Op.OPAQUE, list(dict.fromkeys(refs)), {
            "kind": n.op, "target": target, "template": template, "rowwise_ok": rowwise,
            "random": random, "inplace": inplace,
        }, n.name)

    # ---- known calls: return (op, fx args, attrs), an IR id (identity) or None (opaque)
    def function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target in _BINARY_FUNCS:
            return self.binary(_BINARY_FUNCS[target], args, kwargs)
        if target in _UNARY_FUNCS:
            b = _bind(args, kwargs, ("input", "inplace"), {"inplace": False})
            if b is None or b["inplace"] or not isinstance(b["input"], fx.Node):
                return None
            return _UNARY_FUNCS[target], [b["input"]], {}
        if target is F.leaky_relu:
            b = _bind(args, kwargs, ("input", "negative_slope", "inplace"),
                      {"negative_slope": 0.01, "inplace": False})
            if b is None or b["inplace"] or not _is_scalar(b["negative_slope"]):
                return None
            return Op.LEAKY_RELU, [b["input"]], {"slope": float(b["negative_slope"])}
        if target is F.linear:
            b = _bind(args, kwargs, ("input", "weight", "bias"), {"bias": None})
            if b is None or not isinstance(b["weight"], fx.Node):
                return None
            if b["bias"] is not None and not isinstance(b["bias"], fx.Node):
                return None
            xs = [b["input"], b["weight"]] + ([b["bias"]] if b["bias"] is not None else [])
            return Op.LINEAR, xs, {"module": None}
        if target is torch.reshape:
            b = _bind(args, kwargs, ("input", "shape"), {})
            shape = None if b is None else _int_tuple(b["shape"])
            return None if shape is None else (Op.RESHAPE, [b["input"]], {"shape": shape})
        if target in (torch.unsqueeze, torch.squeeze, torch.flatten, torch.sum, torch.mean):
            if not args:
                return None
            return self.method(target.__name__, args, kwargs)
        if target is torch.gather:
            b = _bind(args, kwargs, ("input", "dim", "index", "sparse_grad"),
                      {"sparse_grad": False})
            if b is None or b["sparse_grad"] or not isinstance(b["dim"], int):
                return None
            return Op.GATHER, [b["input"], b["index"]], {"dim": b["dim"]}
        if target is torch.index_select:
            b = _bind(args, kwargs, ("input", "dim", "index"), {})
            if b is None or not isinstance(b["dim"], int):
                return None
            return Op.INDEX_SELECT, [b["input"], b["index"]], {"dim": b["dim"]}
        if target in (torch.cat, torch.concat, torch.concatenate):
            dim_name = "axis" if "axis" in kwargs else "dim"
            b = _bind(args, kwargs, ("tensors", dim_name), {dim_name: 0})
            if b is None or not isinstance(b["tensors"], (list, tuple)) or not b["tensors"] \
                    or not isinstance(b[dim_name], int):
                return None
            if not all(isinstance(t, fx.Node) for t in b["tensors"]):
                return None
            return Op.CAT, list(b["tensors"]), {"dim": b[dim_name]}
        return None

    def method(self, name: str, args: tuple, kwargs: dict) -> Any:
        if not args or not isinstance(args[0], fx.Node):
            return None
        x, rest = args[0], tuple(args[1:])
        if name in _BINARY_METHODS:
            return self.binary(_BINARY_METHODS[name], args, kwargs)
        if name in _UNARY_METHODS:
            return None if (rest or kwargs) else (_UNARY_METHODS[name], [x], {})
        if name in ("view", "reshape"):
            shape = None if kwargs else _shape_args(rest)
            if shape is None:
                return None
            return (Op.VIEW if name == "view" else Op.RESHAPE), [x], {"shape": shape}
        if name == "expand":
            sizes = None if kwargs else _shape_args(rest)
            return None if sizes is None else (Op.EXPAND, [x], {"sizes": sizes})
        if name == "unsqueeze":
            b = _bind(rest, kwargs, ("dim",), {})
            if b is None or not isinstance(b["dim"], int):
                return None
            return Op.UNSQUEEZE, [x], {"dim": b["dim"]}
        if name == "squeeze":
            b = _bind(rest, kwargs, ("dim",), {"dim": None})
            if b is None or not (b["dim"] is None or isinstance(b["dim"], int)):
                return None
            return Op.SQUEEZE, [x], {"dim": b["dim"]}
        if name == "flatten":
            b = _bind(rest, kwargs, ("start_dim", "end_dim"), {"start_dim": 0, "end_dim": -1})
            if b is None or not all(isinstance(b[k], int) for k in ("start_dim", "end_dim")):
                return None
            return Op.FLATTEN, [x], {"start": b["start_dim"], "end": b["end_dim"]}
        if name in ("sum", "mean"):
            b = _bind(rest, kwargs, ("dim", "keepdim", "dtype"),
                      {"dim": None, "keepdim": False, "dtype": None})
            if b is None or b["dtype"] is not None or _dim(b["dim"]) is False \
                    or not isinstance(b["keepdim"], bool):
                return None
            op = Op.SUM if name == "sum" else Op.MEAN
            return op, [x], {"dim": _dim(b["dim"]), "keepdim": b["keepdim"]}
        if name == "gather":
            b = _bind(rest, kwargs, ("dim", "index", "sparse_grad"), {"sparse_grad": False})
            if b is None or b["sparse_grad"] or not isinstance(b["dim"], int) \
                    or not isinstance(b["index"], fx.Node):
                return None
            return Op.GATHER, [x, b["index"]], {"dim": b["dim"]}
        if name == "index_select":
            b = _bind(rest, kwargs, ("dim", "index"), {})
            if b is None or not isinstance(b["dim"], int) or not isinstance(b["index"], fx.Node):
                return None
            return Op.INDEX_SELECT, [x, b["index"]], {"dim": b["dim"]}
        return None

    def binary(self, op: Op, args: tuple, kwargs: dict) -> Any:
        extra = {"alpha": 1} if op in (Op.ADD, Op.SUB) else {}
        if op == Op.DIV:
            extra = {"rounding_mode": None}
        b = _bind(args, kwargs, ("input", "other", *extra), extra)
        if b is None or any(b[k] != v for k, v in extra.items()):
            return None
        a, c = b["input"], b["other"]
        for v in (a, c):
            if not (isinstance(v, fx.Node) or _is_scalar(v)):
                return None
        return op, [a, c], {}

    def module(self, target: str, args: tuple, kwargs: dict) -> Any:
        mod = self.tracer.root.get_submodule(target)
        path = target[len("layer."):] if target.startswith("layer.") else None
        if path is None or kwargs or len(args) != 1 or not isinstance(args[0], fx.Node):
            return None
        if not _lowerable(mod):
            return None
        return self.lower_module(path, mod, self.val(args[0]))

    def lower_module(self, path: str, mod: nn.Module, x: int) -> int:
        """IR for ``mod(x)`` (``x`` an IR id); ``nn.Sequential`` is inlined child by child."""
        if type(mod) is nn.Sequential:
            for name, child in mod.named_children():
                x = self.lower_module(f"{path}.{name}", child, x)
            return x
        if type(mod) is nn.Linear:
            w = self.node(Op.PARAM, [], {"path": f"{path}.weight"}, f"{path}.weight")
            ids = [x, w]
            if mod.bias is not None:
                ids.append(self.node(Op.PARAM, [], {"path": f"{path}.bias"}, f"{path}.bias"))
            return self.node(Op.LINEAR, ids, {"module": path}, path)
        if type(mod) is nn.Identity:
            return x
        if type(mod) is nn.LeakyReLU:
            return self.node(Op.LEAKY_RELU, [x], {"slope": float(mod.negative_slope)}, path)
        return self.node(_ACT_MODULES[type(mod)], [x], {}, path)


def _lowerable(mod: nn.Module) -> bool:
    """Modules the IR expresses: Linear, Identity, ReLU/Sigmoid/Tanh/LeakyReLU (not in
    place), and ``nn.Sequential`` chains of them (inlined, so hoist and split see inside)."""
    if type(mod) is nn.Sequential:
        return len(mod) > 0 and all(_lowerable(m) for m in mod)
    if type(mod) in (nn.Linear, nn.Identity):
        return True
    return type(mod) in (*_ACT_MODULES, nn.LeakyReLU) and not getattr(mod, "inplace", False)


def _module_is_random(mod: nn.Module) -> bool:
    return any(isinstance(m, _RANDOM_MODULES) for m in mod.modules())


def _module_is_inplace(mod: nn.Module) -> bool:
    return any(getattr(m, "inplace", False) is True for m in mod.modules())


def _module_is_rowwise(mod: nn.Module) -> bool:
    if isinstance(mod, nn.Sequential):
        return all(_module_is_rowwise(m) for m in mod)
    return type(mod) in _ROWWISE_MODULES
