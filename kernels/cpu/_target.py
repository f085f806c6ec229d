"""The machine code numba generates for ngra's kernels: full-width AVX-512 where the host has it.

LLVM tunes AVX-512 x86 targets (Skylake-SP onwards) to prefer 256-bit vectors, so numba's
kernels use ``ymm`` registers even where ``zmm`` ones exist. The generated edge kernels are
compute-bound on their inlined ``exp``/``sigmoid`` polynomials. On this project's
Sapphire Rapids machines (2 threads), ``NGRA_AVX512={1,0} experiments/train_bench.py
--showcase-only --frameworks ngra`` measured the G-GCN edge stage's forward + backward
(R-MAT 2^16, F = 64) at 204 ms against 240 ms, and the two-layer step at 563 against 671 ms.

:func:`configure` must run before numba compiles anything in the process (the CPU
target reads its feature string once); ``ngra.kernels.cpu`` calls it first thing. It
changes nothing when the host lacks AVX-512F, when the user set ``NUMBA_CPU_NAME`` or
``NUMBA_CPU_FEATURES`` themselves, or when ``NGRA_AVX512=0`` (:mod:`ngra.settings`). Where
it acts it sets ``NUMBA_CPU_FEATURES`` in the process's environment too (worker processes
then generate the same code) and says so in one INFO log line. numba's on-disk cache is
keyed on the feature string, so code cached under one setting is never reused under
another.

:func:`load_implementations` loads what numba's first compile or cache load would (the NRT
module, which LLVM compiles, and numba's registries of implementations) ahead of it, and
without ``scipy.linalg``: ``numba.np.arraymath`` imports ``scipy.linalg.cython_blas`` at
import only to set ``_HAVE_BLAS``, and that runs ``scipy.linalg``'s ``__init__`` (LAPACK
and BLAS wrappers, decompositions, matrix functions): 15 MB of a rank's fixed cost (issue
41, ``experiments/rank_fixed_cost.py``). The flag picks the inner product that njit code's
``np.convolve`` / ``np.correlate`` use (BLAS ``dot`` or a loop); ngra's kernels call
neither, and ``np.dot`` / ``np.linalg`` in njit code still import ``scipy.linalg`` when they
compile. CPU ranks call it first thing (:func:`ngra.training.ranks.run_rank`).
"""

from __future__ import annotations

import logging
import os
import sys

from ngra.settings import get

__all__ = ["configure", "load_implementations"]

#: What ``numba.np.arraymath`` imports to ask whether BLAS exists (and runs scipy.linalg).
_BLAS_PROBE = "scipy.linalg.cython_blas"

log = logging.getLogger(__name__)

#: LLVM's x86 tuning flag that caps auto-vectorization at 256 bits.
PREFER_256 = "prefer-256-bit"


def configure() -> str | None:
    """Let numba vectorize with 512-bit registers on AVX-512 hosts.

    Returns:
        The feature string now in force, or ``None`` where nothing was changed.
    """
    if not get("NGRA_AVX512"):
        return None
    if "NUMBA_CPU_FEATURES" in os.environ or "NUMBA_CPU_NAME" in os.environ:
        return None
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features
    from numba.core.registry import cpu_target

    if "_toplevel_target_context" in vars(cpu_target):
        log.debug("numba compiled before ngra.kernels.cpu was imported: keeping its target")
        return None
    features = get_host_cpu_features()
    if "+avx512f" not in features.split(","):
        return None
    features = f"{features},-{PREFER_256}"
    # The environment too: numba re-reads NUMBA_* variables before compiling, and
    # worker processes (torch.multiprocessing) then generate the same code.
    os.environ["NUMBA_CPU_FEATURES"] = features
    config.CPU_FEATURES = features
    log.info("NGRA_AVX512: set NUMBA_CPU_FEATURES to the host's features with -%s, so numba "
             "generates 512-bit vector code (NGRA_AVX512=0 leaves numba's target alone)",
             PREFER_256)
    return features


def load_implementations() -> bool:
    """Load numba's CPU implementations now, without ``scipy.linalg`` (see the module's
    docstring). Returns whether it left ``scipy.linalg`` out: not where numba had already
    loaded them or ``scipy.linalg`` was already imported (nothing to save)."""
    from numba.core.registry import cpu_target

    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        cpu_target.target_context.refresh()
        return False
    sys.modules[_BLAS_PROBE] = None  # its import raises ModuleNotFoundError, parent unrun
    try:
        cpu_target.target_context.refresh()
    finally:
        if sys.modules.get(_BLAS_PROBE, 0) is None:
            del sys.modules[_BLAS_PROBE]
    return True
