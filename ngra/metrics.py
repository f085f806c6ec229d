"""Link-prediction metrics, exactly as OGB's ``linkproppred`` evaluator and sklearn compute them.

* :func:`hits_at_k` (ogbl-collab, -ppa, -ddi): all positives are ranked against one
  shared set of negatives. A positive is a hit when its score is **strictly greater**
  than the K-th highest negative score (a tie with it counts against the positive).
  With fewer than K negatives every positive is a hit (OGB returns 1.0).
* :func:`mrr` / :func:`rank_metrics` (ogbl-citation2): positive ``i`` is ranked among
  its own negatives ``neg[i, :]``. Its rank is the average of the optimistic rank
  (``1 +`` negatives scoring strictly higher) and the pessimistic one (``1 +`` negatives
  scoring at least as high), so ties cost half. MRR is the mean of ``1 / rank``; OGB's
  ``hits@k_list`` is ``rank <= k``.
* :func:`roc_auc` (ogbl-vessel; sklearn's ``roc_auc_score`` with positives labelled 1):
  the Mann-Whitney statistic from the ranks of all scores, tied scores sharing the
  average of their ranks, i.e. the probability that a random positive outscores a
  random negative, a tie counting one half.

Scores are logits or probabilities (any monotone transform gives the same values);
``torch`` tensors or numpy arrays, on any device. Each function returns a Python float.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["hits_at_k", "mrr", "rank_metrics", "ranks", "roc_auc"]

Scores = torch.Tensor | np.ndarray | Sequence[float]


def _scores(x: Scores, name: str, dim: int) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != dim:
        want = "[P]" if dim == 1 else "[P, K]"
        raise ValueError(f"{name} must be {want} scores ({dim}-D); got shape {list(t.shape)}.")
    if not t.is_floating_point():
        t = t.double()
    if torch.isnan(t).any():
        raise ValueError(f"{name} holds {int(torch.isnan(t).sum())} NaN scores; ranking "
                         "metrics need comparable scores (check the model's output).")
    return t


def hits_at_k(pos: Scores, neg: Scores, k: int) -> float:
    """Share of positives scoring above the K-th highest negative (OGB's Hits@K).

    Args:
        pos: ``[P]`` scores of the positive pairs.
        neg: ``[M]`` scores of the negative pairs, shared by all positives.
        k: ``K >= 1``.
    """
    pos, neg = _scores(pos, "pos", 1), _scores(neg, "neg", 1)
    if int(k) < 1:
        raise ValueError(f"k must be >= 1; got {k}.")
    if pos.numel() == 0:
        raise ValueError("hits_at_k needs at least one positive score; got pos of shape [0].")
    if neg.numel() < k:
        return 1.0
    kth = torch.topk(neg, int(k)).values[-1].to(pos.device)
    return float((pos > kth).double().mean())


def ranks(pos: Scores, neg: Scores) -> torch.Tensor:
    """``[P]`` float64 rank of each positive among its own negatives (OGB's average of the
    optimistic and pessimistic rank; 1 is best).

    Args:
        pos: ``[P]`` positive scores.
        neg: ``[P, K]`` scores of each positive's negatives.
    """
    pos, neg = _scores(pos, "pos", 1), _scores(neg, "neg", 2)
    if neg.shape[0] != pos.shape[0]:
        raise ValueError(f"neg must have a row per positive: [{pos.shape[0]}, K]; got "
                         f"{list(neg.shape)}.")
    col = pos.to(neg.device).view(-1, 1)
    optimistic = (neg > col).sum(1)
    pessimistic = (neg >= col).sum(1)
    return 0.5 * (optimistic + pessimistic).double() + 1.0


def mrr(pos: Scores, neg: Scores) -> float:
    """Mean reciprocal rank of each positive among its own negatives (ogbl-citation2).

    Args:
        pos: ``[P]`` positive scores.
        neg: ``[P, K]`` scores of each positive's negatives.
    """
    r = ranks(pos, neg)
    if r.numel() == 0:
        raise ValueError("mrr needs at least one positive score; got pos of shape [0].")
    return float((1.0 / r).mean())


def rank_metrics(pos: Scores, neg: Scores, ks: Sequence[int] = (1, 3, 10)) -> dict[str, float]:
    """``{"mrr": ..., "hits@1": ..., ...}``: the means of OGB's ``mrr_list`` and
    ``hits@k_list`` (``rank <= k``) for per-positive negatives ``neg`` ``[P, K]``."""
    r = ranks(pos, neg)
    if r.numel() == 0:
        raise ValueError("rank_metrics needs at least one positive score; got pos of shape [0].")
    out = {"mrr": float((1.0 / r).mean())}
    out.update({f"hits@{k}": float((r <= k).double().mean()) for k in ks})
    return out


def roc_auc(pos: Scores, neg: Scores) -> float:
    """Area under the ROC curve of positives (label 1) against negatives (label 0), tied
    scores sharing their average rank (sklearn's ``roc_auc_score``).

    Args:
        pos: ``[P]`` positive scores.
        neg: ``[M]`` negative scores.
    """
    pos, neg = _scores(pos, "pos", 1), _scores(neg, "neg", 1)
    p, m = pos.numel(), neg.numel()
    if p == 0 or m == 0:
        raise ValueError(f"roc_auc needs both classes: got {p} positive and {m} negative "
                         "scores (ROC AUC is not defined with one class).")
    both = torch.cat([pos.double().cpu(), neg.double().cpu()])
    sorted_scores, order = torch.sort(both)
    _, counts = torch.unique_consecutive(sorted_scores, return_counts=True)
    ends = torch.cumsum(counts, 0).double()  # 1-based rank of each tie group's last member
    group_rank = ends - (counts.double() - 1) / 2  # the group's average rank
    rank = torch.empty_like(both)
    rank[order] = torch.repeat_interleave(group_rank, counts)
    u = float(rank[:p].sum()) - p * (p + 1) / 2
    return u / (p * m)
