"""The register-accumulating row sum under the CPU g-SpMM (kernels/cpu/_rowsum.py):
every feature width (whole vectors, masked tails, several chunks), both float dtypes and
index widths, with and without per-source weights, against a float64 loop."""

import numpy as np
import pytest
from numba import njit

from ngra.kernels.cpu._rowsum import sum_rows


@njit(nogil=True)
def _rows(indptr, indices, src, scale, out, oscale, v0, v1):
    for v in range(v0, v1):
        sum_rows(indices, src, scale, out, v, indptr[v], indptr[v + 1], 3, oscale)


def _case(rng, width, dtype, itype, num_src=29, num_dst=17):
    deg = rng.integers(0, 6, num_dst)
    deg[3] = 0  # an empty row: written as zeros
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(itype)
    indices = rng.integers(0, num_src, int(indptr[-1])).astype(itype)
    src = rng.standard_normal((num_src, width)).astype(dtype)
    return indptr, indices, src


def _reference(indptr, indices, src, scale, oscale):
    out = np.zeros((len(indptr) - 1, src.shape[1]))
    for v in range(len(indptr) - 1):
        for j in range(indptr[v], indptr[v + 1]):
            u = indices[j]
            out[v] += (1.0 if scale is None else float(scale[u])) * src[u].astype(np.float64)
    return out * oscale


@pytest.mark.parametrize("width", [1, 5, 15, 16, 17, 31, 32, 33, 47, 64, 65, 100, 128, 130])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_sums_match_a_float64_loop(width, dtype):
    rng = np.random.default_rng(width)
    for itype in (np.int32, np.int64):
        indptr, indices, src = _case(rng, width, dtype, itype)
        for scale in (None, rng.standard_normal(src.shape[0]).astype(dtype)):
            out = np.full((len(indptr) - 1, width), np.nan, dtype)
            _rows(indptr, indices, src, scale, out, 0.5, 0, len(indptr) - 1)
            tol = 1e-5 if dtype == np.float32 else 1e-12
            np.testing.assert_allclose(out, _reference(indptr, indices, src, scale, 0.5),
                                       rtol=tol, atol=tol)


@pytest.mark.parametrize("width", [5, 17, 64, 70])
def test_a_row_writes_its_own_columns_only(width):
    """The masked tail stores no lane past the row: the next row stays untouched."""
    rng = np.random.default_rng(0)
    indptr, indices, src = _case(rng, width, np.float32, np.int64)
    out = np.full((len(indptr) - 1, width), np.nan, np.float32)
    _rows(indptr, indices, src, None, out, 1.0, 4, 5)
    assert np.isfinite(out[4]).all()
    assert np.isnan(np.delete(out, 4, axis=0)).all()


def test_an_empty_feature_width_writes_nothing():
    indptr = np.array([0, 2], np.int64)
    out = np.empty((1, 0), np.float32)
    _rows(indptr, np.array([0, 1], np.int64), np.empty((2, 0), np.float32), None, out, 1.0,
          0, 1)
    assert out.shape == (1, 0)
