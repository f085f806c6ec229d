"""Helpers for the kernel oracle tests: run a function on a backend, compare results."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ngra.kernels import use_backend


def run(
    backend: str,
    fn: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor | None],
    grad_out: torch.Tensor | None = None,
    gen: torch.Generator | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor | None], torch.Tensor]:
    """``fn(*inputs)`` on ``backend`` (fresh leaf copies), then backward with ``grad_out``.

    Returns ``(out, grads of the float inputs, grad_out used)``; ``grad_out`` is
    drawn from ``gen`` when not given, so a second call can reuse it.
    """
    leaves = [
        x.detach().clone().requires_grad_(x.is_floating_point()) if x is not None else None
        for x in inputs
    ]
    with use_backend(backend):
        out = fn(*leaves)
        if grad_out is None:
            grad_out = torch.randn(out.shape, dtype=out.dtype, generator=gen)
        if out.requires_grad:
            out.backward(grad_out)
    grads = [x.grad if x is not None and x.is_floating_point() else None for x in leaves]
    return out.detach(), grads, grad_out


def tolerance(dtype: torch.dtype, terms: int = 1) -> dict[str, float]:
    """Tolerances for sums of ``terms`` values accumulated in another order."""
    scale = max(1.0, float(terms) ** 0.5)
    if dtype == torch.float64:
        return {"rtol": 1e-9, "atol": 1e-10 * scale}
    return {"rtol": 1e-4, "atol": 1e-5 * scale}


def assert_same(
    a: Sequence[torch.Tensor | None],
    b: Sequence[torch.Tensor | None],
    dtype: torch.dtype,
    terms: int = 1,
) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert (x is None) == (y is None), f"output {i}: one backend returned None"
        if x is not None:
            torch.testing.assert_close(
                x, y, **tolerance(dtype, terms), msg=lambda m, i=i: f"output {i}: {m}"
            )


def max_degree(indptr: torch.Tensor) -> int:
    return int((indptr[1:] - indptr[:-1]).max()) if indptr.numel() > 1 else 0


def assert_as_accurate(
    got: Sequence[torch.Tensor | None],
    oracle: Sequence[torch.Tensor | None],
    truth: Sequence[torch.Tensor | None],
    dtype: torch.dtype,
    terms: int = 1,
) -> None:
    """``got`` is about as accurate as ``oracle`` (same dtype), both measured against
    ``truth`` (the oracle in float64). For float32 sums of many terms, where two
    summation orders legitimately differ by more than ``rtol`` from each other.

    Each output's max error must stay within twice the oracle's, plus the spread of a
    sequential sum of ``terms`` rounded values, ``8 u sqrt(terms) max|truth|`` (``u`` the
    unit roundoff; a sum's rounding error grows like ``u sqrt(n)`` times its partial sums,
    and 8 leaves room for the random walk), plus :func:`tolerance`'s ``atol``. A wrong
    edge term is off by the size of a term, far beyond that.
    """
    assert len(got) == len(oracle) == len(truth)
    atol = tolerance(dtype, terms)["atol"]
    unit = torch.finfo(dtype).eps / 2
    for i, (x, y, t) in enumerate(zip(got, oracle, truth)):
        assert (x is None) == (y is None) == (t is None), f"output {i}: one backend returned None"
        if x is None or not x.numel():
            continue
        err = (x.double() - t.double()).abs().max().item()
        spread = 8 * unit * max(1.0, terms) ** 0.5 * t.double().abs().max().item()
        bound = 2 * (y.double() - t.double()).abs().max().item() + spread + atol
        assert err <= bound, (f"output {i}: max error {err:.3g} against float64, the oracle's "
                              f"in {dtype} allows {bound:.3g}")
