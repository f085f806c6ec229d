"""The device path of tile staging: host terms streamed to a CUDA device tile by tile
(pinned buffers, non-blocking copies on a side stream), results back on the host."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn

from ngra import Graph, SagaLayer
from ngra.models import GATConv, GCNConv, GGCNConv, MPNNConv
from ngra.runtime.budget import grid_shape
from ngra.runtime.staging import Stager, compute_device, staging_mode

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

N, F = 200, 8


class _Tanh(SagaLayer):  # generic edge stage with parameters: recomputed in backward
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(F, F)

    def apply_edge(self, edge):
        return torch.tanh(self.lin(edge.src) - edge.dst)


def _case(name):
    g = Graph.from_edge_index(torch.randint(0, N, (2, 2000)), num_nodes=N)
    if name == "gcn":
        g = g.gcn_norm()
        return GCNConv(F, F), g
    if name == "gat":
        return GATConv(F, F, heads=2), g.add_self_loops()
    if name == "ggcn":
        return GGCNConv(F, F), g
    return _Tanh(), g


@pytest.mark.parametrize("staging", ["gather", "span"])
@pytest.mark.parametrize("name", ["gcn", "gat", "ggcn", "generic"])
def test_host_terms_stream_to_the_gpu(name, staging):
    layer, g = _case(name)
    layer = layer.double()
    x = torch.randn(N, F, dtype=torch.float64, requires_grad=True)
    ref = layer(g, x)
    go = torch.randn_like(ref)
    want = torch.autograd.grad(ref, [x, *layer.parameters()], go, allow_unused=True)
    on_gpu = copy.deepcopy(layer)
    if name == "generic":  # its edge stage reads lin: the layer's device is the compute device
        on_gpu = on_gpu.cuda()
        ctx = contextlib.nullcontext()
    else:  # parameter-free edge stages: the device is chosen explicitly
        ctx = compute_device("cuda")
    with ctx, grid_shape(3, 3), staging_mode(staging):
        out = on_gpu(g, x)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, ref)
    got = torch.autograd.grad(out, [x, *on_gpu.parameters()], go, allow_unused=True)
    for a, b in zip(got, want):
        if a is None or b is None:
            continue
        torch.testing.assert_close(a.cpu(), b)


@pytest.mark.parametrize("grid", [(1, 1), (3, 2)])
def test_fused_edge_network_with_parameters_streams_to_the_gpu(grid):
    """MPNN lowers to a fused edge kernel that reads parameters (a weight column, a bias):
    they follow the staged rows to the compute device, their gradients come back."""
    g = Graph.from_edge_index(torch.randint(0, N, (2, 2000)), num_nodes=N)
    layer = MPNNConv(F, F, edge_dim=1).double()
    x = torch.randn(N, F, dtype=torch.float64, requires_grad=True)
    ed = torch.randn(g.num_edges, 1, dtype=torch.float64)
    ref = layer(g, x, ed)
    go = torch.randn_like(ref)
    want = torch.autograd.grad(ref, [x, *layer.parameters()], go)
    with compute_device("cuda"), grid_shape(*grid):
        out = layer(g, x, ed)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, ref)
    for a, b in zip(torch.autograd.grad(out, [x, *layer.parameters()], go), want):
        torch.testing.assert_close(a, b)


def test_staged_rows_arrive_on_the_device():
    from ngra.partition import tile_graph

    g = Graph.from_edge_index(torch.randint(0, N, (2, 2000)), num_nodes=N)
    x = torch.randn(N, F)
    tile = tile_graph(g, 2, 2).tiles[0]
    st = Stager(x, None, device=torch.device("cuda")).stage(tile).ready()
    assert st.src.device.type == "cuda" and st.view.src_idx.device.type == "cuda"
    rows = tile.src_rows.long()
    got = st.src.cpu()
    want = x.index_select(0, rows) if st.mode == "gather" else x[rows[0]:rows[-1] + 1]
    torch.testing.assert_close(got, want)
