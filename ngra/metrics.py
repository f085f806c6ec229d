"""Link- and graph-property metrics, exactly as OGB's evaluators and sklearn compute them.

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
* :func:`average_precision` (sklearn's ``average_precision_score``): the scores sorted
  from the highest, each **distinct** score a threshold (tied scores enter together, so
  their order does not matter); AP is the sum over thresholds of the recall gained there
  times the precision there.
* :func:`mean_over_tasks` (OGB's ``graphproppred`` evaluator, ``rocauc`` (here ``roc_auc``)
  and ``ap``):
  ``[G, T]`` binary labels with NaN for a missing label; each task is scored on its
  labeled graphs when they hold a positive and a negative, and the metric is the mean over
  those tasks (OGB raises when no task qualifies; so does this, with ``ValueError``).

Scores are logits or probabilities (any monotone transform gives the same values);
``torch`` tensors or numpy arrays, on any device. Each function returns a Python float.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["TASK_METRICS", "average_precision", "hits_at_k", "mean_over_tasks", "mrr",
           "rank_metrics", "ranks", "roc_auc"]

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


def average_precision(pos: Scores, neg: Scores) -> float:
    """Average precision of positives (label 1) against negatives (label 0), each distinct
    score one threshold (sklearn's ``average_precision_score``).

    Args:
        pos: ``[P]`` positive scores (at least one).
        neg: ``[M]`` negative scores (may be empty: AP is then 1).
    """
    pos, neg = _scores(pos, "pos", 1), _scores(neg, "neg", 1)
    p = pos.numel()
    if p == 0:
        raise ValueError("average_precision needs at least one positive score; got pos of "
                         "shape [0] (precision is not defined without positives).")
    both = torch.cat([pos.double().cpu(), neg.double().cpu()])
    label = torch.cat([torch.ones(p, dtype=torch.float64),
                       torch.zeros(neg.numel(), dtype=torch.float64)])
    order = torch.argsort(both, descending=True, stable=True)
    both, label = both[order], label[order]
    _, counts = torch.unique_consecutive(both, return_counts=True)
    last = torch.cumsum(counts, 0) - 1  # each tie group's last position: a threshold
    tp = torch.cumsum(label, 0)[last]
    precision = tp / (last + 1).double()
    recall_gain = torch.diff(tp, prepend=tp.new_zeros(1)) / p
    return float((recall_gain * precision).sum())


#: The per-task metrics of :func:`mean_over_tasks`, by ngra's name (OGB's ``eval metric``
#: ``rocauc`` is ``roc_auc`` here, as in link prediction's summaries).
TASK_METRICS = {"roc_auc": roc_auc, "ap": average_precision}


def mean_over_tasks(y: Scores, scores: Scores, metric: str) -> tuple[float, int]:
    """OGB's graph-property ``rocauc`` (here ``roc_auc``) / ``ap``: the mean over tasks of
    the metric on each task's labeled graphs, over the tasks whose labeled graphs hold both a
    positive and a negative.

    Args:
        y: ``[G, T]`` labels 0 or 1, NaN where missing (``[G]``: one task).
        scores: ``[G, T]`` scores (logits or probabilities), as ``y``.
        metric: ``"roc_auc"`` or ``"ap"``.

    Returns:
        ``(mean, tasks scored)``.

    Raises:
        ValueError: shapes that differ, an unknown metric, or no task with both a positive
            and a negative label (as OGB's evaluator raises).
    """
    if metric not in TASK_METRICS:
        raise ValueError(f"metric must be one of {sorted(TASK_METRICS)}; got {metric!r}.")
    y, scores = torch.as_tensor(y).double().cpu(), torch.as_tensor(scores).double().cpu()
    if y.dim() == 1:
        y, scores = y.view(-1, 1), scores.reshape(-1, 1)
    if y.shape != scores.shape or y.dim() != 2:
        raise ValueError(f"y and scores must both be [G, T]; got {list(y.shape)} and "
                         f"{list(scores.shape)}.")
    values = []
    for t in range(y.shape[1]):
        col, s = y[:, t], scores[:, t]
        pos, neg = s[col == 1], s[col == 0]  # NaN (missing) is neither
        if pos.numel() and neg.numel():
            values.append(TASK_METRICS[metric](pos, neg))
    if not values:
        raise ValueError(f"no task has both a positive and a negative labeled graph among "
                         f"these {y.shape[0]} graphs, so {metric} is not defined (OGB's "
                         "evaluator raises too); score more graphs.")
    return float(np.mean(values)), len(values)
