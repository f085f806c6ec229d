"""Gather accumulators: how per-edge results are reduced per destination.

Each accumulator works tile by tile so that the same code serves whole-graph
execution (one tile) and chunked streaming (many tiles per destination column):

* ``partial(indptr, msg, drop=None)`` reduces one tile's edge results ``[E_t, ...]``
  over the tile's local CSC (``indptr`` over the destination interval) into a
  partial state (``drop``: the softmax gather's attention dropout on the tile's edges);
* ``combine(state, partial, in_place=False)`` merges partial states of tiles in the same
  column (``in_place``: both are the caller's to overwrite, outside autograd: no
  state-sized temporaries);
* ``finalize(state, in_degree, in_place=False)`` turns the column's state into the
  ``acc`` handed to ``apply_vertex`` (``in_place``: the state is the caller's to
  overwrite). Destinations without in-edges get 0.

For backward under chunked streaming (recompute one tile at a time),
``final_stats(state, acc)`` keeps what a tile needs to know about its whole
column (nothing for sum/mean, the final extremes for max/min, the log-sum-exp
and output for softmax), and ``contribution(part, final, in_degree)`` turns a
recomputed tile partial into a tensor whose gradient, given the gradient of
``acc``, is exactly the tile's share of the gradient.

Each backward pass first calls ``for_backward(final)`` once per set of destinations
and hands its result to every tile's ``contribution``. Max and min need it: an
extreme that several tiles of a column hold exactly (a tie, e.g. messages equal to a
bias wherever a ReLU before it is all zero) goes to the first of them that the
backward walk reaches, as the kernels give it to the first extreme edge; every tile
that holds it receiving it would count its gradient once per tile. The walk marks
what it has handed out in a mask that ``for_backward`` makes fresh for each pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ngra import kernels
from ngra.kernels.lean import broadcast_shape
from ngra.graph import segment_ids

__all__ = ["Accumulator", "PerFieldAccumulator", "make_accumulator", "check_gather", "GATHERS",
           "FIELD_GATHERS"]

GATHERS = ("sum", "mean", "max", "min", "softmax")
#: the reducers a per-field gather (a dict) may name
FIELD_GATHERS = ("sum", "mean", "max", "min")


def check_gather(gather: Any, owner: str) -> None:
    """Raise ``TypeError`` unless ``gather`` is one of :data:`GATHERS` or a non-empty dict
    of field name -> one of :data:`FIELD_GATHERS` (``owner`` names the layer in the
    message)."""
    if isinstance(gather, str):
        if gather not in GATHERS:
            raise TypeError(f"{owner}.gather must be one of {GATHERS} or a dict of field -> "
                            f"one of {FIELD_GATHERS}; got {gather!r}.")
        return
    if not isinstance(gather, Mapping):
        raise TypeError(f"{owner}.gather must be one of {GATHERS} or a dict of field -> one of "
                        f"{FIELD_GATHERS}; got {type(gather).__name__}.")
    if not gather:
        raise TypeError(f"{owner}.gather is an empty dict: name a reducer per field of "
                        "apply_edge's dict result, e.g. {'m': 'mean', 'hi': 'max'}.")
    for field, name in gather.items():
        if not isinstance(field, str):
            raise TypeError(f"{owner}.gather: field names must be strings (the keys of "
                            f"apply_edge's dict result); got {field!r}.")
        if name == "softmax":
            raise TypeError(
                f"{owner}.gather[{field!r}] = 'softmax': a softmax gather normalizes a "
                "(score, value) pair over the in-edges and does not mix with per-field "
                f"reducers. Use gather = 'softmax' on a layer of its own; per-field gathers "
                f"take {FIELD_GATHERS}.")
        if name not in FIELD_GATHERS:
            raise TypeError(f"{owner}.gather[{field!r}] must be one of {FIELD_GATHERS}; "
                            f"got {name!r}.")


class Accumulator:
    """Sum (and the base of the linear accumulators)."""

    name = "sum"
    linear = True

    def partial(self, indptr: torch.Tensor, msg: Any, drop: Any = None) -> Any:
        return _map(msg, lambda m: kernels.segment_reduce(indptr, m, "sum"))

    def combine(self, state: Any, part: Any, in_place: bool = False) -> Any:
        if state is None:
            return part
        return _map2(state, part, _add_into if in_place else torch.add)

    def finalize(self, state: Any, in_degree: torch.Tensor, in_place: bool = False) -> Any:
        return state

    def final_stats(self, state: Any, acc: torch.Tensor) -> Any:
        return None

    def for_backward(self, final: Any) -> Any:
        """What one backward pass hands every tile's :meth:`contribution` (module docs)."""
        return final

    def contribution(self, part: Any, final: Any, in_degree: torch.Tensor) -> torch.Tensor:
        # Linear accumulators: the tile's share of acc is its own finalized partial.
        return self.finalize(part, in_degree)


class MeanAccumulator(Accumulator):
    name = "mean"

    def finalize(self, state: Any, in_degree: torch.Tensor, in_place: bool = False) -> Any:
        def div(s: torch.Tensor) -> torch.Tensor:
            d = in_degree.clamp(min=1).to(s.dtype).view(-1, *([1] * (s.dim() - 1)))
            # in place on a sum the kernels made (no [N, F] more, no first touch): nothing
            # saved it; not through a custom Function's view (a probe's marker returns one)
            ours = in_place and (not s.requires_grad or not s.is_leaf)
            if ours and not isinstance(s.grad_fn, torch.autograd.function.BackwardCFunction):
                return s.div_(d)
            return s / d

        return _map(state, div)


class ExtremeAccumulator(Accumulator):
    """Max or min: partial states carry which destinations had edges in the tile."""

    linear = False

    def __init__(self, name: str) -> None:
        self.name = name
        self._pick = torch.maximum if name == "max" else torch.minimum

    def partial(self, indptr: torch.Tensor, msg: Any, drop: Any = None) -> Any:
        has = indptr[1:] > indptr[:-1]
        return (_map(msg, lambda m: kernels.segment_reduce(indptr, m, self.name)), has)

    def combine(self, state: Any, part: Any, in_place: bool = False) -> Any:
        if state is None:
            return part
        (a, ha), (b, hb) = state, part

        def merge(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            shape = (-1,) + (1,) * (x.dim() - 1)
            both = self._pick(x, y)
            return torch.where((ha & hb).view(shape), both, torch.where(hb.view(shape), y, x))

        return (_map2(a, b, merge), ha | hb)

    def finalize(self, state: Any, in_degree: torch.Tensor, in_place: bool = False) -> Any:
        return state[0]

    def final_stats(self, state: Any, acc: torch.Tensor) -> Any:
        return acc.detach()

    def for_backward(self, final: Any) -> Any:
        # the extremes, and which of them a tile of this pass has already taken
        return final, torch.zeros(final.shape, dtype=torch.bool, device=final.device)

    def contribution(self, part: Any, final: Any, in_degree: torch.Tensor) -> torch.Tensor:
        # Only the first tile holding a destination's extreme receives its gradient.
        values, has = part
        extremes, taken = final
        shape = (-1,) + (1,) * (values.dim() - 1)
        mask = has.view(shape) & (values.detach() == extremes.to(values.device))
        mask &= ~taken.to(values.device)
        taken |= mask.to(taken.device)
        return torch.where(mask, values, torch.zeros_like(values))


class SoftmaxAccumulator(Accumulator):
    """Softmax-weighted sum with an online (max, sum) merge across tiles.

    Messages are ``(score, value)`` with ``score`` ``[E, H]`` (or ``[E]``) and
    ``value`` ``[E, H, D]`` (or ``[E, D]``); the result has ``value``'s shape per
    destination. The state is ``(max m, sum s, weighted sum o)``; a fused kernel over
    the whole graph hands in ``(0, None, normalized output)``.

    Attention dropout (``drop``, an :class:`~ngra.kernels.EdgeDropout` over the tile's
    edges) multiplies the weights in ``o`` by their keep factors (the score's trailing
    dimensions flattened are the heads); ``s`` stays the undropped normalizer, so every
    merge and the backward's contribution rule hold unchanged.
    """

    name = "softmax"
    linear = False

    def partial(self, indptr: torch.Tensor, msg: Any, drop: Any = None) -> Any:
        score, value = _split_softmax_msg(msg)
        m = kernels.segment_reduce(indptr, score.detach(), "max")
        dst = segment_ids(indptr, total=score.shape[0])
        w = torch.exp(score - m.index_select(0, dst))
        s = kernels.segment_reduce(indptr, w, "sum")
        if drop is not None:
            w = w * drop.factors(score.shape[1:].numel(), w.dtype, w.device).view(score.shape)
        o = kernels.segment_reduce(indptr, _bcast(w, value) * value, "sum")
        return (m, s, o)

    def combine(self, state: Any, part: Any, in_place: bool = False) -> Any:
        if state is None:
            return part
        (m1, s1, o1), (m2, s2, o2) = state, part
        if s1 is None or s2 is None:
            raise RuntimeError("internal error: a whole-graph softmax state (already "
                               "normalized) cannot merge with another tile's.")
        m = torch.maximum(m1, m2)
        # Scores of empty rows are 0 in both, and so are their sums: the rescale is harmless.
        a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
        if in_place and _writable(s1, s2, o1, o2):  # factors [D, H]; no copy of o [D, H, C]
            return (m, s1.mul_(a1).add_(s2.mul_(a2)),
                    o1.mul_(_bcast(a1, o1)).add_(o2.mul_(_bcast(a2, o2))))
        return (m, s1 * a1 + s2 * a2, o1 * _bcast(a1, o1) + o2 * _bcast(a2, o2))

    def finalize(self, state: Any, in_degree: torch.Tensor, in_place: bool = False) -> Any:
        _, s, o = state
        if s is None:  # a fused kernel's whole-graph state is normalized already
            return o
        s = torch.where(s > 0, s, torch.ones_like(s))
        return o.div_(_bcast(s, o)) if in_place and _writable(o) else o / _bcast(s, o)

    def final_stats(self, state: Any, acc: torch.Tensor) -> Any:
        m, s, _ = state
        if s is None:
            return m.detach(), acc.detach()
        lse = m + torch.log(torch.where(s > 0, s, torch.ones_like(s)))
        return lse.detach(), acc.detach()

    def contribution(self, part: Any, final: Any, in_degree: torch.Tensor) -> torch.Tensor:
        # With L and out fixed, d[exp(m - L) (o - s out)] equals the tile's share of
        # d out for any differentiable partial state (m, s, o): the normalizer's
        # gradient enters through -s * out.
        m, s, o = part
        lse, out = final
        # Rows without edges in this tile (s = 0) contribute nothing, whatever m holds.
        w = torch.exp(torch.where(s > 0, m - lse, torch.full_like(lse, float("-inf"))))
        return _bcast(w, o) * (o - _bcast(s, o) * out)


class PerFieldAccumulator(Accumulator):
    """A reducer per field of a dict message (``gather = {"m": "mean", "hi": "max"}``):
    each state, partial and result is a dict holding each field's own accumulator's."""

    name = "per-field"

    def __init__(self, fields: Mapping[str, str]) -> None:
        check_gather(fields, "layer")
        self.fields = dict(fields)
        self.rules = {k: make_accumulator(v) for k, v in self.fields.items()}
        self.linear = all(r.linear for r in self.rules.values())

    def check(self, msg: Any, what: str | None = None) -> None:
        """Raise ``ValueError`` unless ``msg`` is a dict with exactly the gather's fields
        (``what`` describes a ``msg`` that is not a dict; default: its type)."""
        if not isinstance(msg, Mapping):
            raise ValueError(f"gather = {self.fields} names a reducer per field of a dict "
                             f"message; apply_edge returned {what or type(msg).__name__}.")
        unknown = [k for k in self.fields if k not in msg]
        missing = [k for k in msg if k not in self.fields]
        if unknown or missing:
            raise ValueError(
                f"gather = {self.fields} must name one reducer per field of apply_edge's "
                f"result, fields {list(msg)}: " + "; ".join(
                    ([f"no field {unknown} in the result"] if unknown else [])
                    + ([f"no reducer for {missing}"] if missing else [])) + ".")

    def partial(self, indptr: torch.Tensor, msg: Any, drop: Any = None) -> Any:
        self.check(msg)
        return {k: r.partial(indptr, msg[k]) for k, r in self.rules.items()}

    def combine(self, state: Any, part: Any, in_place: bool = False) -> Any:
        if state is None:
            return part
        return {k: r.combine(state[k], part[k], in_place) for k, r in self.rules.items()}

    def finalize(self, state: Any, in_degree: torch.Tensor, in_place: bool = False) -> Any:
        return {k: r.finalize(state[k], in_degree, in_place) for k, r in self.rules.items()}

    def final_stats(self, state: Any, acc: Any) -> Any:
        return {k: r.final_stats(state[k], acc[k]) for k, r in self.rules.items()}

    def for_backward(self, final: Any) -> Any:
        return {k: r.for_backward(final[k]) for k, r in self.rules.items()}

    def contribution(self, part: Any, final: Any, in_degree: torch.Tensor) -> Any:
        return {k: r.contribution(part[k], final[k], in_degree) for k, r in self.rules.items()}


def make_accumulator(name: str | Mapping[str, str]) -> Accumulator:
    """The accumulator of a gather: a name of :data:`GATHERS` or a per-field dict."""
    if isinstance(name, Mapping):
        return PerFieldAccumulator(name)
    if name == "sum":
        return Accumulator()
    if name == "mean":
        return MeanAccumulator()
    if name in ("max", "min"):
        return ExtremeAccumulator(name)
    if name == "softmax":
        return SoftmaxAccumulator()
    raise ValueError(f"gather must be one of sum, mean, max, min, softmax; got {name!r}.")


def _split_softmax_msg(msg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(msg, tuple) and len(msg) == 2):
        raise TypeError(
            "with gather = 'softmax', apply_edge must return (score, value); "
            f"got {type(msg).__name__}."
        )
    score, value = msg
    if score.dim() > value.dim() or tuple(score.shape) != tuple(value.shape[: score.dim()]):
        raise ValueError(
            "softmax gather: score must match value's leading dimensions, e.g. score [E, H] "
            f"with value [E, H, D]; got score {list(score.shape)} and value {list(value.shape)}."
        )
    return score, value


def _bcast(w: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return w.reshape(tuple(w.shape) + (1,) * (like.dim() - w.dim()))


def _map(x: Any, fn: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: fn(v) for k, v in x.items()}
    return fn(x)


def _map2(x: Any, y: Any, fn: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: fn(x[k], y[k]) for k in x}
    return fn(x, y)


def _writable(*ts: torch.Tensor) -> bool:
    """Whether in-place ops may write ``ts``: none is an expanded view (an empty tile's
    partial can be a broadcast zero) or part of an autograd graph (a probe's marker
    returns a custom Function's view)."""
    return all(t.is_contiguous() and not t.requires_grad for t in ts)


def _add_into(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.add_(b) if _writable(a) and a.shape == broadcast_shape(a.shape, b.shape) \
        else a + b
