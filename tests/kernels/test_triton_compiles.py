"""The gpu backend's kernels compile for a GPU, not only in Triton's interpreter.

The interpreter runs any Python a kernel reads; the compiler refuses some of it (a module
global that is not ``tl.constexpr``: ``gspmm``'s reducer codes once ran in every interpreter
test and failed on the first H200 it met). Two checks without a GPU: no jitted kernel reads a
module-level global that is not a constexpr, and g-SpMM compiles to a Hopper cubin
(``triton.compile`` with an explicit target needs no device: triton ships ptxas).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[2] / "kernels" / "gpu"


def _module_globals(tree: ast.Module) -> dict[str, str]:
    """Module-level assigned names -> the source of their value."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for el in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(el, ast.Name):
                        out[el.id] = ast.unparse(node.value)
    return out


def _jit_reads(tree: ast.Module):
    """``(kernel, name)`` for every name a ``triton.jit`` body reads."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
                "jit" in ast.unparse(d) for d in node.decorator_list):
            for stmt in node.body:
                for sub in ast.walk(stmt):
                    if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                        yield node.name, sub.id


@pytest.mark.parametrize("path", sorted(GPU_DIR.glob("*.py")), ids=lambda p: p.name)
def test_kernels_read_only_constexpr_globals(path):
    tree = ast.parse(path.read_text())
    glob = _module_globals(tree)
    bad = sorted({f"{k} reads {n} = {glob[n]}" for k, n in _jit_reads(tree)
                  if n in glob and "constexpr" not in glob[n]})
    assert not bad, f"{path.name}: jitted kernels read non-constexpr globals: {bad}"


_COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
from ngra.kernels.gpu import gspmm as G

fn = G._spmm
while not isinstance(fn, JITFunction):  # under the autotuner
    fn = fn.fn
ptr = {"indptr": "*i64", "indices": "*i32", "eperm": "*i32", "src": "*fp32", "edge": "*fp32",
       "arg": "*i64", "s_src": "*fp32", "s_dst": "*fp32", "out": "*fp32", "out_arg": "*i64"}
sig = {**ptr, "F": "i32", "D": "i32", "H": "i32", "AVG_DEG": "i32",
       **{k: "constexpr" for k in ("REDUCE", "EDGE", "HAS_PERM", "MASKED", "SCALED",
                                   "IDENTITY", "BLOCK_E", "BLOCK_F")}}
names = list(sig)
for reduce in G._CODES.values():
    for edge in (G.NO_EDGE, G.HEAD_EDGE, G.FULL_EDGE):
        # GCN's factored weights: sum/mean without edge data; segment reduction (each row
        # its own source): without edge data
        for scaled, identity in ([(False, False), (True, False), (False, True)]
                                 if edge == G.NO_EDGE else [(False, False)]):
            if scaled and reduce > G.MEAN.value:
                continue
            cx = {"REDUCE": reduce, "EDGE": edge.value, "HAS_PERM": False, "MASKED": False,
                  "SCALED": scaled, "IDENTITY": identity, "BLOCK_E": 16, "BLOCK_F": 64}
            src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v
                                                              for k, v in cx.items()})
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
            assert kernel.asm["cubin"], (reduce, edge, scaled, identity)
print("compiled")
"""


@pytest.mark.timeout(300)
def test_gspmm_compiles_for_hopper():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True,
                       env=env, timeout=280, check=False)
    if r.returncode and "ptxas" in r.stderr and "not found" in r.stderr:
        pytest.skip("this triton has no ptxas to compile with")
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-3000:]


_COMPILE_DROPOUT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ngra.kernels.gpu import dropout as D

sig = {"x": "*fp32", "out": "*fp32", "base": "*i64", "seeds": "*i64", "scale": "*fp32",
       "n": "i64", "row": "i64", "HAS_BASE": "constexpr", "BLOCK": "constexpr"}
names = list(sig)
for has_base in (False, True):  # by flat position; by row ids (dropout_rows)
    src = ASTSource(fn=D._dropout, signature=sig,
                    constexprs={(names.index("HAS_BASE"),): has_base,
                                (names.index("BLOCK"),): D.ELEMS_PER_PROGRAM})
    assert triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["cubin"], has_base
print("compiled")
"""


@pytest.mark.timeout(300)
def test_dropout_compiles_for_hopper():
    """The uint32 hash (wrapping multiplies, logical shifts) lowers for sm_90."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE_DROPOUT], capture_output=True,
                       text=True, env=env, timeout=280, check=False)
    if r.returncode and "ptxas" in r.stderr and "not found" in r.stderr:
        pytest.skip("this triton has no ptxas to compile with")
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-3000:]
