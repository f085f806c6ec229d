"""The PyG and DGL baselines compute the zoo models' math: with the zoo model's weights
copied in, the same outputs and input gradients (the benchmarks compare like with like)."""

from __future__ import annotations

import pytest
import torch

import ngra
from ngra.characterize.workloads import BASELINE_MODELS, build_ngra, prepare_workload

N = 30


def _dataset():
    gen = torch.Generator().manual_seed(7)
    src = torch.randint(0, N, (120,), generator=gen)
    dst = torch.randint(0, N, (120,), generator=gen)
    dst[:3] = 4  # a hub
    g = ngra.Graph.from_edge_index(torch.stack([src, dst]), num_nodes=N)

    class DS:  # the NodeDataset fields prepare_workload reads
        name, graph, x = "random", g, torch.randn(N, 6, generator=gen)
        y, train_mask = torch.randint(0, 3, (N,), generator=gen), torch.ones(N, dtype=torch.bool)
        num_classes, edge_type, num_edge_types = 3, None, 1

    return DS


def _renamed(state: dict[str, torch.Tensor], model: str, framework: str) -> dict[str, torch.Tensor]:
    """The zoo model's state under the baseline's parameter names."""
    out = {}
    for key, t in state.items():
        key = key.replace("layers.", "convs.", 1)
        if model == "commnet":  # tanh(h(x) + c(mean)): SAGEConv's root and neighbour linears
            head, name = key.rsplit(".", 2)[0], key.split(".", 2)[2]
            if framework == "pyg":
                names = {"h.weight": "lin_r.weight", "h.bias": "lin_l.bias",
                         "c.weight": "lin_l.weight"}
            else:
                names = {"h.weight": "fc_self.weight", "h.bias": "fc_self.bias",
                         "c.weight": "fc_neigh.weight"}
            out[f"{head}.{names[name]}"] = t
            continue
        out[key] = t
    return out


@pytest.mark.parametrize("framework", ["pyg", "dgl"])
@pytest.mark.parametrize("model", ["ggcn", "commnet", "mpnn"])
def test_baseline_matches_zoo_model(model, framework):
    if framework == "pyg":
        pytest.importorskip("torch_geometric")
        from ngra.characterize.pyg_models import build_pyg as build
    else:
        from ngra.compat import import_dgl

        try:
            import_dgl()
        except ImportError as e:
            pytest.skip(f"DGL unavailable: {e}")
        from ngra.characterize.dgl_models import build_dgl as build
    w = prepare_workload(_dataset(), model, hidden=8)
    torch.manual_seed(0)
    ours, base = build_ngra(w).eval(), build(w).eval()
    missing, unexpected = base.load_state_dict(_renamed(ours.state_dict(), model, framework),
                                               strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    x1 = w.x.clone().requires_grad_()
    x2 = w.x.clone().requires_grad_()
    a, b = ours(w.graph, x1, w.edge_data), base(x2)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    a.square().sum().backward()
    b.square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", BASELINE_MODELS)
def test_baseline_dropout_is_the_zoo_layout(model):
    """Dropout before every layer (and head) in training mode, none in eval mode."""
    pytest.importorskip("torch_geometric")
    from ngra.characterize.pyg_models import build_pyg

    w = prepare_workload(_dataset(), model, hidden=8)
    net = build_pyg(w, dropout=0.5, attention_dropout=0.5)
    torch.manual_seed(1)
    with torch.no_grad():
        e1, e2 = net.eval()(w.x), net(w.x)
        t1 = net.train()(w.x)
    torch.testing.assert_close(e1, e2)
    assert not torch.allclose(t1, e1)
    assert net.dropout == 0.5
