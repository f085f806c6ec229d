"""ngra.kernels.cpu lets numba use 512-bit vectors on AVX-512 hosts, and only there;
NGRA_AVX512=0 and a user's own NUMBA_CPU_FEATURES/NUMBA_CPU_NAME are left alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

PROBE = ("import ngra.kernels.cpu; from numba.core import config; "
         "from numba.core.codegen import get_host_cpu_features as f; "
         "print(repr(config.CPU_FEATURES)); print('+avx512f' in f().split(','))")


def _probe(**env) -> tuple[str, bool]:
    full = {k: v for k, v in os.environ.items()
            if k not in ("NGRA_AVX512", "NUMBA_CPU_FEATURES", "NUMBA_CPU_NAME")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=full, timeout=120, check=True)
    features, avx512 = out.stdout.split()[-2:]
    return features, avx512 == "True"


def test_avx512_hosts_drop_the_256_bit_preference():
    features, avx512 = _probe()
    if avx512:
        assert features.endswith(",-prefer-256-bit'") and "+avx512f" in features
    else:
        assert features == "None"


def test_opt_out_and_user_settings_are_respected():
    assert _probe(NGRA_AVX512="0")[0] == "None"
    assert _probe(NUMBA_CPU_FEATURES="+avx2")[0] == "'+avx2'"


#: load_implementations in a fresh process, then njit code that needs BLAS (np.dot)
LEAN = """
import sys
import numpy as np
from numba import njit
from ngra.kernels.cpu import load_implementations
print(load_implementations(), "scipy.linalg" in sys.modules)
a = np.arange(6.0).reshape(2, 3)
print(float(njit(lambda x: np.dot(x, x.T).sum())(a)) == float((a @ a.T).sum()),
      "scipy.linalg" in sys.modules, load_implementations())
"""


@pytest.mark.timeout(120)
def test_numba_s_implementations_load_without_scipy_linalg_and_blas_still_works():
    out = subprocess.run([sys.executable, "-c", LEAN], capture_output=True, text=True,
                         timeout=100, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    # left out, then imported by np.dot's compile, which gives the right answer; a second
    # call has nothing left to save
    assert out.stdout.split() == ["True", "False", "True", "True", "False"]
