"""experiments/accuracy_bench.py's mask-generator check (``ngra-torchmasks``): ngra's
dropout masks drawn by torch's generator on the reference kernels, the same mask in forward
and backward, the hash's kernels back in place afterwards; and its report section."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import ngra
from ngra.kernels import dropout, softmax_aggregate, use_backend
from ngra.kernels.dropout import EdgeDropout

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import accuracy_bench as ab  # noqa: E402


def test_torch_masks_draw_from_torch_and_match_forward_and_backward():
    import ngra.kernels.ref.dropout as rd

    hashed = rd.keep_mask
    x = torch.ones(300, 200, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    with use_backend("ref"):
        want = dropout(x, 0.6)
    torch.manual_seed(3)
    with ab.torch_masks():
        y = dropout(x, 0.6)
        y.backward(torch.ones_like(y))
    kept = y.detach() != 0
    assert abs(kept.double().mean().item() - 0.4) < 0.01  # 60,000 draws: 8 std errors
    assert not torch.equal(kept, want.detach() != 0)  # not the hash's mask
    torch.testing.assert_close(x.grad, y.detach())  # backward drew the forward's mask
    assert rd.keep_mask is hashed  # restored


def test_torch_masks_drop_attention_weights_the_same_in_backward():
    """gradcheck: finite differences of forward (each call draws the drop's mask again)
    against backward's gradient fail unless backward draws forward's mask."""
    g = ngra.Graph.from_edge_index(torch.randint(0, 20, (2, 120)), num_nodes=20)
    ss, sd = torch.randn(20, 2, dtype=torch.float64), torch.randn(20, 2, dtype=torch.float64)
    v = torch.randn(20, 2, 3, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(0)
    with ab.torch_masks():
        drop = EdgeDropout.draw(0.5, None, num_edges=g.num_edges)
        k = drop.factors(2, torch.float64)
        assert set(k.unique().tolist()) == {0.0, 2.0}
        assert torch.autograd.gradcheck(
            lambda t: softmax_aggregate(g.indptr, g.indices, ss, sd, t, dropout=drop), (v,))


def test_report_compares_the_generators_on_common_seeds(tmp_path, monkeypatch):
    monkeypatch.setattr(ab, "NOTES", tmp_path / "none.md")
    rows = []
    for fw, accs in (("ngra", [0.70, 0.72, 0.74]), ("pyg", [0.71, 0.73, 0.75]),
                     (ab.MASK_CHECK, [0.69, 0.71])):
        for seed, a in enumerate(accs):
            rows.append({"model": "gat", "dataset": "citeseer", "protocol": "paper",
                         "framework": fw, "seed": str(seed), "test_acc": str(a),
                         "val_acc": "0", "best_epoch": "1", "epochs": "5", "seconds": "1"})
    out = tmp_path / "accuracy.md"
    ab.write_report(rows, out, {"date": "d", "argv": "a", "git": "g", "machine": "m"})
    text = out.read_text()
    assert "| gat | citeseer | paper | 2 (0-1) | 71.00 | 70.00 | 72.00 |" in text
