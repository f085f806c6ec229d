"""The alpha-beta link model: fitting, the collective formulas, calibration and its cache."""

from __future__ import annotations

import json
import random

import pytest

from ngra.distributed.link import OPS, AlphaBeta, LinkModel, calibrate, calibration_path, load_link


def _model(p: int = 4, alpha: float = 1e-4, beta: float = 1e-9) -> LinkModel:
    return LinkModel("gloo", "cpu", p, "host", {op: AlphaBeta(alpha, beta) for op in OPS},
                     gemm_flops=1e10, gather_bytes=1e10)


def test_fit_recovers_a_line():
    rnd = random.Random(0)
    a, b = rnd.uniform(1e-5, 1e-3), rnd.uniform(1e-10, 1e-8)
    xs = [1e3, 1e5, 1e6, 8e6]
    ab = AlphaBeta.fit(xs, [a + b * x for x in xs])
    assert ab.alpha == pytest.approx(a, rel=1e-6) and ab.beta == pytest.approx(b, rel=1e-6)


def test_fit_keeps_both_terms_non_negative():
    assert AlphaBeta.fit([1, 2, 3], [3.0, 2.0, 1.0]) == AlphaBeta(2.0, 0.0)
    ab = AlphaBeta.fit([1.0, 2.0, 3.0], [0.5, 2.0, 3.5])  # intercept -1 -> through the origin
    assert ab.alpha == 0.0 and ab.beta > 0


def test_ring_all_reduce_formula():
    m = _model(p=4, alpha=2e-5, beta=1e-9)
    n = 1 << 20
    assert m.all_reduce(n) == pytest.approx(2 * 3 * 2e-5 + 2 * 3 / 4 * n * 1e-9)
    assert m.all_gather(n) == pytest.approx(3 * 2e-5 + 3 / 4 * n * 1e-9)
    assert _model(p=1).all_reduce(n) == 0.0 and _model(p=1).p2p(n) == 0.0


def test_json_roundtrip_and_damaged_files(tmp_path):
    m = _model()
    assert LinkModel.from_json(json.loads(json.dumps(m.to_json()))) == m
    bad = tmp_path / "link.json"
    bad.write_text("{not json")
    assert load_link(bad) is None
    bad.write_text(json.dumps({**m.to_json(), "version": 0}))
    assert load_link(bad) is None


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_calibrate_measures_once_and_caches():
    m = calibrate(2)
    assert m.world_size == 2 and m.backend == "gloo" and set(m.ops) == set(OPS)
    assert all(ab.alpha >= 0 and ab.beta >= 0 for ab in m.ops.values())
    assert m.gemm_flops > 0 and m.gather_bytes > 0
    path = calibration_path("gloo", "cpu", 2)
    assert load_link(path) == m
    assert calibrate(2, refresh=False) == m  # read back, not measured again


def test_gemm_rates_by_shape_interpolate_the_samples():
    from ngra.distributed.link import GemmTable, gemm_shapes

    shapes = gemm_shapes()
    # a made-up machine: small products at 80 GFLOP/s, large ones at 20
    table = GemmTable(tuple((m, k, n, 2 * m * k * n / (80e9 if m * k * n < 1e7 else 20e9))
                            for m, k, n in shapes))
    for m, k, n, t in table.samples:
        assert table(m, k, n) == pytest.approx(t, rel=0.05)
    assert table.rate(3000, 2000, 3000) == pytest.approx(20e9, rel=0.05)
    assert table(0, 16, 16) == 0.0
    m = LinkModel("gloo", "cpu", 2, "h", {op: AlphaBeta(0, 0) for op in OPS}, 1e10, 1e10,
                  gemm=table)
    assert LinkModel.from_json(json.loads(json.dumps(m.to_json()))) == m
