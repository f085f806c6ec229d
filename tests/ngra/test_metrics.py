"""Link and graph-property metrics: hand-computed cases, OGB's evaluator formulas written
out literally, pairwise AUC and per-positive AP references, and sklearn when it is
installed (it is not in CI)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ngra.metrics import (average_precision, hits_at_k, mean_over_tasks, mrr, rank_metrics,
                          ranks, roc_auc)


def test_hits_at_k_hand_cases():
    neg = [0.9, 0.5, 0.1, 0.7]
    # K=2: the 2nd highest negative is 0.7; 0.7 itself is not a hit (ties go against it)
    assert hits_at_k([0.8, 0.7, 0.6, 1.0], neg, 2) == 0.5
    assert hits_at_k([0.8, 0.7, 0.6, 1.0], neg, 1) == 0.25  # only 1.0 beats 0.9
    assert hits_at_k([0.0], neg, 5) == 1.0  # fewer negatives than K: OGB returns 1
    assert hits_at_k(torch.tensor([0.95]), np.array(neg), 1) == 1.0


def test_hits_at_k_matches_ogbs_numpy_formula():
    rng = np.random.default_rng(0)
    for _ in range(20):
        pos = rng.integers(0, 20, 30).astype(np.float64)  # many ties on purpose
        neg = rng.integers(0, 20, 50).astype(np.float64)
        k = int(rng.integers(1, 60))
        want = 1.0 if len(neg) < k else float(np.sum(pos > np.sort(neg)[-k])) / len(pos)
        assert hits_at_k(pos, neg, k) == want


def test_mrr_hand_case_with_ties():
    pos = [0.5, 0.9, 0.2]
    neg = [[0.1, 0.6, 0.5],   # one higher, one tied: optimistic 2, pessimistic 3 -> 2.5
           [0.1, 0.2, 0.3],   # best: rank 1
           [0.2, 0.2, 0.2]]   # all tied: (1 + 4) / 2 = 2.5
    assert ranks(pos, neg).tolist() == [2.5, 1.0, 2.5]
    assert mrr(pos, neg) == pytest.approx((1 / 2.5 + 1 + 1 / 2.5) / 3)
    got = rank_metrics(pos, neg, ks=(1, 3))
    assert got["hits@1"] == pytest.approx(1 / 3) and got["hits@3"] == 1.0


def test_mrr_matches_ogbs_torch_formula():
    g = torch.Generator().manual_seed(1)
    pos = torch.randint(0, 10, (40,), generator=g).float()
    neg = torch.randint(0, 10, (40, 100), generator=g).float()
    optimistic = (neg > pos.view(-1, 1)).sum(1)
    pessimistic = (neg >= pos.view(-1, 1)).sum(1)
    ranking = 0.5 * (optimistic + pessimistic) + 1
    assert mrr(pos, neg) == pytest.approx(float((1.0 / ranking).mean()))
    assert rank_metrics(pos, neg)["hits@10"] == pytest.approx(float((ranking <= 10).float().mean()))


def _pairwise_auc(pos, neg):
    p, n = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return float(((p > n) + 0.5 * (p == n)).mean())


def test_roc_auc_hand_cases_and_pairwise_reference():
    assert roc_auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert roc_auc([0.1], [0.9]) == 0.0
    assert roc_auc([0.5, 0.5], [0.5]) == 0.5
    assert roc_auc([0.3, 0.7], [0.3, 0.1]) == pytest.approx(0.875)  # 1 + 0.5 tie + 1 + 1
    rng = np.random.default_rng(2)
    for _ in range(10):
        pos, neg = rng.integers(0, 8, 25).astype(float), rng.integers(0, 8, 31).astype(float)
        assert roc_auc(pos, neg) == pytest.approx(_pairwise_auc(pos, neg))


@pytest.mark.parametrize("ours, theirs", [(roc_auc, "roc_auc_score"),
                                          (average_precision, "average_precision_score")])
def test_matches_sklearn(ours, theirs):
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(3)
    for _ in range(5):  # many ties on purpose
        pos, neg = rng.integers(0, 6, 40).astype(float), rng.normal(2, 2, 60).round()
        want = getattr(metrics, theirs)(np.r_[np.ones(40), np.zeros(60)], np.r_[pos, neg])
        assert ours(pos, neg) == pytest.approx(want)


def test_errors_name_expected_and_arrived():
    with pytest.raises(ValueError, match=r"pos must be \[P\] scores.*\[2, 2\]"):
        hits_at_k(torch.zeros(2, 2), torch.zeros(3), 1)
    with pytest.raises(ValueError, match=r"a row per positive: \[2, K\]; got \[3, 4\]"):
        mrr(torch.zeros(2), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="both classes: got 2 positive and 0 negative"):
        roc_auc([0.1, 0.2], [])
    with pytest.raises(ValueError, match="1 NaN"):
        roc_auc([float("nan"), 0.2], [0.1])
    with pytest.raises(ValueError, match="k must be >= 1"):
        hits_at_k([0.1], [0.2], 0)


def _per_positive_ap(pos, neg):
    """AP as the mean over positives of the precision among the scores at least as high
    as its own (a tie group enters at once): sklearn's sum over thresholds, regrouped."""
    p, both = np.asarray(pos, float), np.r_[np.asarray(pos, float), np.asarray(neg, float)]
    return float(np.mean([(p >= s).sum() / (both >= s).sum() for s in p]))


def test_average_precision_hand_cases_with_ties():
    # thresholds 0.9 (precision 1, recall 1/2) and the tied 0.5s (2/3, recall 1)
    assert average_precision([0.9, 0.5], [0.5, 0.1]) == pytest.approx(0.5 + 0.5 * 2 / 3)
    # no tie: 0.9 (1, 1/3), 0.8 (1/2, no recall gained), the two 0.7s (3/4, recall 1)
    assert average_precision([0.9, 0.7, 0.7], [0.8, 0.1]) == pytest.approx(1 / 3 + 2 / 3 * 0.75)
    assert average_precision([0.2], []) == 1.0
    assert average_precision([0.1], [0.9]) == 0.5
    rng = np.random.default_rng(4)
    for _ in range(10):
        pos, neg = rng.integers(0, 6, 20).astype(float), rng.integers(0, 6, 30).astype(float)
        assert average_precision(pos, neg) == pytest.approx(_per_positive_ap(pos, neg))


def test_mean_over_tasks_scores_tasks_with_both_labels_as_ogb():
    nan = float("nan")
    y = torch.tensor([[1, 0, nan], [0, 0, 1], [1, 0, nan], [nan, 0, 0.]])
    scores = torch.tensor([[0.9, 0.1, 0.3], [0.2, 0.2, 0.8], [0.1, 0.3, 0.5], [5.0, 0.4, 0.6]])
    # task 0: labeled rows 0-2, pos {0.9, 0.1} vs neg {0.2}: AUC 1/2, AP (1 + 2/3) / 2;
    # task 1 has no positive (skipped); task 2: pos {0.8} vs neg {0.6}: 1 and 1
    assert mean_over_tasks(y, scores, "roc_auc") == (pytest.approx(0.75), 2)
    assert mean_over_tasks(y, scores, "ap") == (pytest.approx(((1 + 2 / 3) / 2 + 1) / 2), 2)
    assert mean_over_tasks(y[:, 0], scores[:, 0], "roc_auc")[0] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no task has both a positive and a negative"):
        mean_over_tasks(y[:, 1:2], scores[:, 1:2], "roc_auc")
    with pytest.raises(ValueError, match=r"both be \[G, T\]; got \[4, 3\] and \[4, 2\]"):
        mean_over_tasks(y, scores[:, :2], "ap")
    with pytest.raises(ValueError, match="metric must be one of"):
        mean_over_tasks(y, scores, "acc")
