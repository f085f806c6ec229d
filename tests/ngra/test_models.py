"""The model zoo: shapes and gradients, and numerical parity with PyG's layers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ngra import Graph
from ngra.models import (
    MODELS,
    GATConv,
    GCNConv,
    GINConv,
    SAGEConv,
    build_model,
    defaults_table,
    hyper_parameters,
    prepare,
)

N, F_IN, C = 30, 6, 3


def _graph():
    ei = torch.randint(0, N, (2, 120))
    return Graph.from_edge_index(ei, num_nodes=N).remove_self_loops().symmetrize()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_forward_backward(name):
    g = _graph()
    types = 3 if name in ("ggnn", "rgcn") else 1
    et = torch.randint(0, types, (g.num_edges,)) if types > 1 else None
    if name in ("ggnn", "rgcn"):
        # prepare() adds no edges for these models, so edge types line up with the graph
        assert not MODELS[name].self_loops
    pg, edata = prepare(name, g, et, types)
    model = build_model(name, F_IN, C, hidden=8, heads=2 if name == "gat" else None,
                        num_edge_types=types)
    x = torch.randn(N, F_IN)
    out = model(pg, x, edata)
    assert out.shape == (N, C) and torch.isfinite(out).all()
    out.square().sum().backward()
    for pname, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), pname


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown model 'gxn'; choose one of"):
        build_model("gxn", 3, 2)


@pytest.fixture
def pyg():
    return pytest.importorskip("torch_geometric")


def test_gcn_matches_pyg(pyg):
    from torch_geometric.nn import GCNConv as PygGCN

    g = _graph()
    ours, ref = GCNConv(F_IN, 4), PygGCN(F_IN, 4)
    with torch.no_grad():
        ref.lin.weight.copy_(ours.lin.weight)
        ref.bias.copy_(ours.lin.bias)
    x = torch.randn(N, F_IN, requires_grad=True)
    a = ours(g.gcn_norm(), x)
    b = ref(x, g.edge_index())
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    ga = torch.autograd.grad(a.sum(), x)[0]
    gb = torch.autograd.grad(b.sum(), x)[0]
    torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("concat", [True, False])
def test_gat_matches_pyg(pyg, concat):
    from torch_geometric.nn import GATConv as PygGAT

    g = _graph()
    heads = 3
    ours = GATConv(F_IN, 4, heads=heads, concat=concat)
    ref = PygGAT(F_IN, 4, heads=heads, concat=concat)
    with torch.no_grad():
        ref.lin.weight.copy_(ours.lin.weight)
        ref.att_src.copy_(ours.a_src.view(1, heads, 4))
        ref.att_dst.copy_(ours.a_dst.view(1, heads, 4))
        ref.bias.copy_(ours.bias)
    x = torch.randn(N, F_IN, requires_grad=True)
    a = ours(g.add_self_loops(), x)
    b = ref(x, g.edge_index())  # PyG adds the self-loops itself
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    ga = torch.autograd.grad(a.square().sum(), x)[0]
    gb = torch.autograd.grad(b.square().sum(), x)[0]
    torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-5)


def test_zoo_gat_trains_like_pyg_from_the_same_weights(pyg):
    """The zoo's whole GAT (prepared graph, ELU, heads, Adam with the zoo's weight decay)
    and the same model built from PyG's GATConv: started from one set of weights with
    dropout off, 30 training steps give the same losses. With dropout on, two runs can
    then differ only by their random masks (the accuracy benchmark's premise)."""
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv as PygGAT

    torch.manual_seed(0)
    g = _graph()
    x, y = torch.randn(N, F_IN), torch.randint(0, C, (N,))
    hp = hyper_parameters("gat")
    heads, hid = hp["heads"].value, hp["hidden"].value
    ours = build_model("gat", F_IN, C, dropout=0.0, attention_dropout=0.0)
    graph, edata = prepare("gat", g)
    convs = [m for m in ours.modules() if isinstance(m, GATConv)]
    ref = torch.nn.ModuleList([PygGAT(F_IN, hid, heads=heads),
                               PygGAT(hid * heads, C, heads=1, concat=False)])
    with torch.no_grad():
        for a, b in zip(convs, ref):
            b.lin.weight.copy_(a.lin.weight)
            b.att_src.copy_(a.a_src.view_as(b.att_src))
            b.att_dst.copy_(a.a_dst.view_as(b.att_dst))
            b.bias.copy_(a.bias)
    ei = g.edge_index()

    def pyg_forward():
        return ref[1](F.elu(ref[0](x, ei)), ei)

    decay = hp["weight_decay"].value
    first_only = MODELS["gat"].decay_first_layer_only
    opts = [torch.optim.Adam([{"params": list(first.parameters()), "weight_decay": decay},
                              {"params": list(second.parameters()),
                               "weight_decay": 0.0 if first_only else decay}],
                             lr=hp["lr"].value)
            for first, second in (convs, ref)]
    for step in range(30):
        losses = []
        for opt, forward in zip(opts, (lambda: ours(graph, x, edata), pyg_forward)):
            opt.zero_grad()
            loss = F.cross_entropy(forward(), y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        assert losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-6), step


def test_sage_and_gin_match_pyg(pyg):
    from torch_geometric.nn import GINConv as PygGIN
    from torch_geometric.nn import SAGEConv as PygSAGE

    g = _graph()
    x = torch.randn(N, F_IN)
    ours, ref = SAGEConv(F_IN, 4), PygSAGE(F_IN, 4)
    with torch.no_grad():
        ref.lin_l.weight.copy_(ours.lin_l.weight)
        ref.lin_l.bias.copy_(ours.lin_l.bias)
        ref.lin_r.weight.copy_(ours.lin_r.weight)
    torch.testing.assert_close(ours(g, x), ref(x, g.edge_index()), rtol=1e-5, atol=1e-5)
    gin = GINConv(F_IN, 4, hidden=5)
    with torch.no_grad():
        gin.eps.fill_(0.3)
    ref = PygGIN(gin.mlp, eps=0.3)
    torch.testing.assert_close(gin(g, x), ref(x, g.edge_index()), rtol=1e-5, atol=1e-5)


ACTIVATIONS = {"elu": torch.nn.functional.elu, "relu": torch.nn.functional.relu}


def _activation(name: str):
    from ngra.models.zoo import _elu, _relu

    return {"elu": _elu, "relu": _relu}[name]


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_save_their_output_not_their_input(name):
    """The zoo's ELU (GAT) and ReLU (GCN, SAGE, GIN, MPNN, R-GCN) between layers."""
    act = _activation(name)
    x = torch.randn(40, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(act, (x,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = act(x * 1.0)
    torch.testing.assert_close(y, ACTIVATIONS[name](x))
    assert len(saved) == 1 and saved[0] is y


def _activation_case(name: str, hold: str):
    """x -> act -> y @ w -> sum, backward; ``hold`` keeps y alive in some way.
    Returns (what was kept, its values before backward, whether x's gradient was written
    into y's memory)."""
    act = _activation(name)
    torch.manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, dtype=torch.float64)
    want = torch.autograd.grad((ACTIVATIONS[name](x) @ w).sum(), [x])[0]
    y = act(x)
    kept, stored, ptr = None, [], y.data_ptr()
    if hold == "variable":
        kept = y
    elif hold == "view":
        kept = y[1:]
    elif hold == "hook":
        y.register_hook(stored.append)
    out = (y @ w).sum()
    snapshot = None if kept is None else kept.detach().clone()
    del y
    out.backward()
    torch.testing.assert_close(x.grad, want)
    return kept, snapshot, x.grad.data_ptr() == ptr


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("hold", ["nothing", "variable", "view", "hook"])
def test_activation_backward_in_place_only_over_an_unseen_output(name, hold):
    """The activation's backward writes the gradient over its saved output when no one can
    see that output any more (one N x F tensor less at the backward peak: GAT's, and GCN's
    on R-MAT 2^23); a user's variable or view of it keeps its values."""
    kept, snapshot, in_place = _activation_case(name, hold)
    assert in_place == (hold in ("nothing", "hook"))
    if kept is not None:
        torch.testing.assert_close(kept.detach(), snapshot)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_double_backward_stays_out_of_place(name):
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True) + 0.05
    assert torch.autograd.gradgradcheck(_activation(name), (x,))


def test_build_model_checks_hyper_parameters():
    gat = build_model("gat", 5, 3, hidden=6, heads=3)
    assert gat.layers[0].heads == 3 and gat.layers[0].f_out == 6
    gin = build_model("gin", 5, 3, hidden=12)
    assert gin.layers[0].mlp[0].out_features == 12  # the hidden width reaches the layers
    for kwargs, message in [(dict(hidden=0), "hidden must be a positive integer; got 0"),
                            (dict(hidden=-4), "hidden must be a positive integer"),
                            (dict(dropout=1.5), r"dropout must be a probability in \[0, 1\)"),
                            (dict(num_layers=0), "num_layers must be an integer >= 1")]:
        with pytest.raises(ValueError, match=message):
            build_model("sage", 5, 3, **kwargs)
    with pytest.raises(ValueError, match="heads must be a positive integer; got 0"):
        build_model("gat", 5, 3, heads=0)
    with pytest.raises(ValueError, match="gcn has no heads setting"):
        build_model("gcn", 5, 3, heads=2)
    with pytest.raises(TypeError, match=r"unknown hyper-parameter\(s\) \['width'\]"):
        hyper_parameters("gcn", width=3)


def test_every_default_is_valid_and_has_a_source():
    for name, spec in MODELS.items():
        hp = hyper_parameters(name)  # checks the table's own values
        assert hp["hidden"] and hp["lr"] and hp["weight_decay"] and hp["dropout"], name
        assert (hp["heads"] is not None) == (name == "gat")
        assert all(h is None or h.source.strip() for h in hp.values())


def test_readme_shows_the_defaults_table():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert defaults_table() in readme
