"""Every bad argument raises a clear TypeError/ValueError before any kernel runs."""

from __future__ import annotations

import pytest
import torch

from ngra.kernels import edge_softmax, gsddmm, gspmm, segment_reduce, transpose_csc

# A valid graph: 3 destinations, 4 edges, 3 sources.
IP = torch.tensor([0, 2, 2, 4])
IX = torch.tensor([0, 2, 1, 1])
X = torch.randn(3, 4)
W = torch.randn(4)


def _gspmm(**kw):
    args = {"indptr": IP, "indices": IX, "src_feat": X, "edge_feat": None}
    args.update(kw)
    reduce = args.pop("reduce", "sum")
    rev = args.pop("rev", None)
    return lambda: gspmm(**args, reduce=reduce, rev=rev)


CASES = {
    # graph structure
    "indptr_2d": (_gspmm(indptr=IP.view(1, -1)), ValueError, "indptr must be 1-D"),
    "indptr_float": (_gspmm(indptr=IP.float()), TypeError, "indptr must hold integer ids"),
    "indptr_empty": (_gspmm(indptr=IP[:0]), ValueError, "starts with 0"),
    "indptr_not_zero_first": (_gspmm(indptr=IP + 1), ValueError, r"indptr\[0\] must be 0"),
    "indptr_wrong_last": (
        _gspmm(indptr=torch.tensor([0, 2, 2, 3])),
        ValueError,
        r"indptr\[-1\] must equal the number of edges \(4\); got 3",
    ),
    "indptr_decreasing": (_gspmm(indptr=torch.tensor([0, 3, 2, 4])), ValueError, "non-decreasing"),
    "indices_float": (_gspmm(indices=IX.float()), TypeError, "indices must hold integer ids"),
    "indices_int16": (_gspmm(indices=IX.to(torch.int16)), TypeError, "int32 or int64"),
    "indices_out_of_range": (
        _gspmm(indices=torch.tensor([0, 3, 1, 1])),
        ValueError,
        r"indices must lie in \[0, 3\).*found 3",
    ),
    "indices_negative": (_gspmm(indices=torch.tensor([0, -1, 1, 1])), ValueError, "found -1"),
    "indices_not_tensor": (_gspmm(indices=[0, 2, 1, 1]), TypeError, "torch.Tensor"),
    # features
    "src_1d": (_gspmm(src_feat=torch.randn(3)), ValueError, r"at least 2-D"),
    "src_int": (
        _gspmm(src_feat=torch.ones(3, 4, dtype=torch.int64)),
        TypeError,
        "float32 or float64",
    ),
    "src_half": (_gspmm(src_feat=X.half()), TypeError, "float32 or float64"),
    "edge_rows": (_gspmm(edge_feat=torch.randn(5)), ValueError, r"one row per edge \(4"),
    "edge_dtype": (_gspmm(edge_feat=W.double()), TypeError, "must have src_feat's dtype"),
    "edge_shape": (_gspmm(edge_feat=torch.randn(4, 3)), ValueError, "cannot broadcast"),
    "edge_shape_3d": (
        _gspmm(src_feat=torch.randn(3, 2, 4), edge_feat=torch.randn(4, 1, 4)),
        ValueError,
        "cannot broadcast",
    ),
    "reduce_unknown": (_gspmm(reduce="prod"), ValueError, "reduce must be one of"),
    "rev_not_tuple": (_gspmm(rev=IP), TypeError, "rev must be a tuple"),
    "rev_wrong_rows": (
        _gspmm(rev=(torch.tensor([0, 4]), torch.tensor([0, 0, 2, 2]), torch.arange(4))),
        ValueError,
        "num_src \\+ 1 = 4",
    ),
    "rev_perm_range": (
        _gspmm(
            rev=(torch.tensor([0, 1, 3, 4]), torch.tensor([0, 2, 2, 0]), torch.tensor([0, 2, 3, 9]))
        ),
        ValueError,
        "rev_perm must lie",
    ),
    # gsddmm
    "sddmm_op": (lambda: gsddmm(IP, IX, X, X, op="pow"), ValueError, "op must be one of"),
    "sddmm_target": (
        lambda: gsddmm(IP, IX, X, X, op="add", lhs_target="node"),
        ValueError,
        "lhs_target must be one of",
    ),
    "sddmm_dst_rows": (
        lambda: gsddmm(IP, IX, torch.randn(2, 4), X, op="add"),
        ValueError,
        "needs 3 rows",
    ),
    "sddmm_edge_rows": (
        lambda: gsddmm(IP, IX, X, X, op="add", lhs_target="edge"),
        ValueError,
        "needs 4 rows",
    ),
    "sddmm_src_range": (
        lambda: gsddmm(IP, IX, X, X[:2], op="add"),
        ValueError,
        r"indices must lie in \[0, 2\)",
    ),
    "sddmm_shapes": (
        lambda: gsddmm(IP, IX, X, torch.randn(3, 5), op="add"),
        ValueError,
        "do not broadcast",
    ),
    "sddmm_dtype": (lambda: gsddmm(IP, IX, X, X.double(), op="add"), TypeError, "one dtype"),
    "sddmm_dot_1d": (
        lambda: gsddmm(IP, IX, X[:, 0], X[:, 0], op="dot"),
        ValueError,
        "give them a feature dim",
    ),
    # edge_softmax
    "softmax_rows": (
        lambda: edge_softmax(IP, torch.randn(5)),
        ValueError,
        r"indptr\[-1\] must equal the number of edges \(5\)",
    ),
    "softmax_int": (
        lambda: edge_softmax(IP, torch.ones(4, dtype=torch.int32)),
        TypeError,
        "float32 or float64",
    ),
    "softmax_0d": (lambda: edge_softmax(IP, torch.tensor(1.0)), ValueError, r"\[rows\]"),
    # segment_reduce
    "segment_reduce": (
        lambda: segment_reduce(IP, torch.randn(4, 2), "median"),
        ValueError,
        "reduce must be one of",
    ),
    "segment_rows": (
        lambda: segment_reduce(IP, torch.randn(6, 2)),
        ValueError,
        r"indptr\[-1\] must equal",
    ),
    # transpose
    "transpose_range": (lambda: transpose_csc(IP, IX, 2), ValueError, r"\[0, 2\)"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_argument_raises_clear_error(name):
    call, exc, pattern = CASES[name]
    with pytest.raises(exc, match=pattern):
        call()


def test_valid_arguments_pass():
    assert gspmm(IP, IX, X, W).shape == (3, 4)
    assert gsddmm(IP, IX, X, X, op="dot").shape == (4,)
    assert edge_softmax(IP, W).shape == (4,)
    assert segment_reduce(IP, torch.randn(4, 2)).shape == (3, 2)


def test_in_place_change_is_revalidated():
    # Validation is remembered per tensor version; an in-place edit invalidates it.
    indptr, indices = IP.clone(), IX.clone()
    gspmm(indptr, indices, X)
    indices[1] = 7
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 3\).*found 7"):
        gspmm(indptr, indices, X)
    indices[1] = 2
    indptr[1] = 5
    with pytest.raises(ValueError, match="non-decreasing"):
        gspmm(indptr, indices, X)


def test_validation_depends_on_num_src():
    gspmm(IP, IX, X)  # indices up to 2 are valid for 3 sources ...
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        gspmm(IP, IX, X[:2])  # ... not for 2


def test_inference_mode_tensors():
    # No version counter there: validation is simply not remembered.
    with torch.inference_mode():
        indptr, indices, x = IP.clone(), IX.clone(), X.clone()
        assert gspmm(indptr, indices, x).shape == (3, 4)
        assert gspmm(indptr, indices, x).shape == (3, 4)
