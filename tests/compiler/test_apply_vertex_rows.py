"""``apply_vertex`` must return one row per vertex: any other result is a ValueError that
names the layer, the rows expected and what arrived, on every path (generic UDF executor,
compiled plan, a memory budget's tiles, device streaming's CPU stand-in), before anything
downstream broadcasts it or crashes on it."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
from torch import nn

import ngra
from ngra import compiler
from ngra.compiler import compile_layer
from ngra.runtime.device_schedule import device_streaming
from ngra.runtime.executor import choose_runtime_grid, edge_data_csc

N, F_IN, F_OUT = 300, 16, 8


def _graph() -> ngra.Graph:
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, N, (2, 1500), generator=g)
    return ngra.Graph.from_edge_index(ei, num_nodes=N).gcn_norm()


# what a buggy apply_vertex returns instead of h ([N, F_OUT]), and what the error shows
BAD = {
    "sum_over_vertices": (lambda h: h.sum(0, keepdim=True), "shape [1, 8]"),
    "first_rows": (lambda h: h[:10], "shape [10, 8]"),
    "transposed": (lambda h: h.t(), "shape [8, "),
    "scalar": (lambda h: h.sum(), "shape []"),
    "none": (lambda h: None, "NoneType"),
    "tuple": (lambda h: (h, h), "tuple"),
    "dict_field": (lambda h: {"h": h, "pooled": h.mean(0)}, "field 'pooled' shape [8]"),
}


class BadGCN(ngra.SagaLayer):
    """GCN (a sum of weighted source rows, then a Linear: compiles to a g-SpMM) whose
    apply_vertex mangles the Linear's result with ``bad``."""

    gather = "sum"

    def __init__(self, bad) -> None:
        super().__init__()
        self.lin = nn.Linear(F_IN, F_OUT)
        self.bad = bad

    def apply_edge(self, edge):
        return edge.src * edge.data.unsqueeze(-1)

    def apply_vertex(self, vertex, acc):
        return self.bad(self.lin(acc))


class BadMax(ngra.SagaLayer):
    """A max gather whose apply_vertex reads the vertex too (runs as written)."""

    gather = "max"

    def __init__(self, bad) -> None:
        super().__init__()
        self.lin = nn.Linear(2 * F_IN, F_OUT)
        self.bad = bad

    def apply_edge(self, edge):
        return edge.src - edge.dst

    def apply_vertex(self, vertex, acc):
        return self.bad(self.lin(torch.cat([acc, vertex], -1)))


PATHS = {
    "generic": compiler.disabled,
    "compiled": contextlib.nullcontext,
    "budget_generic": lambda: _both(compiler.disabled(), ngra.memory_budget("64KB")),
    "budget_compiled": lambda: ngra.memory_budget("64KB"),
}


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield


def _message(cls: type, rows: int, arrived: str) -> str:
    return (rf"{cls.__name__}\.apply_vertex must return one row per vertex "
            rf"\(\[{rows}, \.\.\.\].*got .*{re.escape(arrived)}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cls", [BadGCN, BadMax])
@pytest.mark.parametrize("bad", BAD)
def test_bad_apply_vertex_result_is_named(bad, cls, path):
    fn, arrived = BAD[bad]
    layer, g = cls(fn), _graph()
    x = torch.randn(N, F_IN, requires_grad=True)
    with PATHS[path](), pytest.raises(ValueError, match=_message(cls, N, arrived)):
        layer(g, x)


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("cls", [BadGCN, BadMax])
def test_paths_are_the_ones_named(cls, generic):
    """The compiled cases compile (GCN to a g-SpMM, its Linear moved before it), and the
    budget tiles the graph where the plan has per-edge working memory (a fused GCN needs
    none, so its budgeted run is the whole graph): each path above is exercised."""
    layer, g = cls(BAD["first_rows"][0]), _graph()
    x, edata = torch.randn(N, F_IN, requires_grad=True), edge_data_csc(g, None)
    with compiler.disabled() if generic else contextlib.nullcontext():
        plan = compile_layer(layer, g, x, edata)
    assert plan.kind == ("generic" if generic else "compiled"), "\n".join(plan.describe())
    with ngra.memory_budget("64KB"):
        grid, _ = choose_runtime_grid(plan, g, plan.pre(x).terms, edata)
    assert grid.num_tiles > 1 or (cls is BadGCN and not generic), grid.shape


@pytest.mark.parametrize("mode", ["compiled", "generic"])
@pytest.mark.parametrize("bad", BAD)
def test_device_streaming_stand_in(bad, mode):
    """Streamed through the CPU stand-in, in 3 columns: the rows expected are a column's,
    or 1 where the one-vertex run that sizes the copies already shows the result wrong."""
    fn, arrived = BAD[bad]
    layer, g = BadMax(fn), _graph()
    x = torch.randn(N, F_IN, requires_grad=True)
    ctx = compiler.disabled() if mode == "generic" else contextlib.nullcontext()
    with ctx, device_streaming("cpu", parts=3), pytest.raises(ValueError) as err:
        layer(g, x)
    text = str(err.value)
    assert "BadMax.apply_vertex must return one row per vertex" in text, text
    assert arrived.split("[")[0] in text, text
    rows = int(re.search(r"\(\[(\d+), \.\.\.\]", text).group(1))
    assert 1 < rows < N or rows == 1 and "This ran on one vertex" in text, text


@pytest.mark.parametrize("path", PATHS)
def test_good_results_pass(path):
    """One row per vertex, a tensor or a dict of them, is accepted on every path."""
    g = _graph()
    x = torch.randn(N, F_IN, requires_grad=True)
    for fn in (lambda h: h, lambda h: {"h": h, "s": h.sum(-1)}, lambda h: h.unsqueeze(1)):
        with PATHS[path]():
            out = BadGCN(fn)(g, x)
        first = out["h"] if isinstance(out, dict) else out
        assert first.shape[0] == N
