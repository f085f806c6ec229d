"""One description of a generated fused-edge kernel, for every target.

A :class:`KernelSpec` (pass kind x dtype x expression x reducer x term layout x wanted
gradients) is what the compiler's fused edge program becomes at a kernel: the numba
code generator (:mod:`ngra.kernels.cpu._codegen`) and the Triton one
(:mod:`ngra.kernels.gpu._codegen`) each turn the same spec into source text, so one
expression has one meaning on both targets. :func:`load_module` writes such text as a
real module file named by its hash in the kernel cache directory and imports it
(numba and Triton both read a kernel's source from its file; numba also keeps its
compiled code beside it).

Cache directory: ``$NGRA_CACHE/<target>`` if ``NGRA_CACHE`` is set, else
``~/.cache/ngra/<target>``; a private temporary directory if neither is writable.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ngra.kernels.edge_expr import EdgeExpr, derivative
from ngra.settings import get

__all__ = ["KernelSpec", "LEAF_ARRAY", "cache_dir", "load_module"]

log = logging.getLogger(__name__)

#: the array name prefix of each leaf kind in generated code (``s0``, ``d1``, ``e0``)
LEAF_ARRAY = {"src": "s", "dst": "d", "edge": "e"}
_CACHE_DIRS: dict[str, Path] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class KernelSpec:
    """Everything that changes a generated kernel's text.

    Attributes:
        kind: ``"fwd"``, ``"bwd_dst"``, ``"bwd_src"`` or ``"bwd_all"`` (see the targets'
            code generators for what each pass walks; Triton has no ``bwd_all``).
        dtype: ``"float32"`` or ``"float64"``, the terms' dtype.
        expr: the forward expression.
        reduce: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.
        layout: ``((kind, index, wide), ...)`` every leaf the expression reads, sorted;
            ``wide`` is False for a width-1 term (broadcast over columns).
        grads: ``((kind, index), ...)`` leaves whose gradients this kernel writes: dst and
            edge leaves for ``bwd_dst``, src for ``bwd_src``, any for ``bwd_all`` (src
            first, then edge, then dst: the order of its arguments); for ``fwd``, dst
            leaves whose partial derivatives it sums (full width, sum/mean).
        flush_denormals: run with the x86 FTZ/DAZ bits set (numba target only), see
            :data:`ngra.kernels.cpu.fused_edge.FLUSH_DENORMALS`.
        shared: ``(("dst", index), ...)`` dst leaves given as one row that every
            destination reads (a parameter vector; numba target only): read at row 0, and
            their gradients summed over destinations into that row.
        outputs: ``((expr, reduce), ...)`` of a kernel with several outputs (the
            ``fused_edge_multi`` kernels, numba target only): each output has its own
            expression over the same terms and its own reducer, all accumulated in one
            walk; ``expr``/``reduce`` are then the first output's and ``"multi"``.
            Empty for the one-output kernels.
    """

    kind: str
    dtype: str
    expr: EdgeExpr
    reduce: str
    layout: tuple[tuple[str, int, bool], ...]
    grads: tuple[tuple[str, int], ...] = ()
    flush_denormals: bool = False
    shared: tuple[tuple[str, int], ...] = ()
    outputs: tuple[tuple[EdgeExpr, str], ...] = ()

    def roots(self) -> tuple[tuple[EdgeExpr, str], ...]:
        """``((expr, reduce), ...)`` of every output (one for the one-output kernels)."""
        return self.outputs or ((self.expr, self.reduce),)

    def digest(self, version: str) -> str:
        """A hash of the spec and the generator's ``version`` (a kernel file's name)."""
        text = "|".join([
            version, self.kind, self.dtype, self.expr.key(), self.reduce,
            ",".join(f"{k}{i}{'w' if w else 'n'}" for k, i, w in self.layout),
            ",".join(f"{k}{i}" for k, i in self.grads),
            "ftz" if self.flush_denormals else "",
        ] + ([",".join(f"{k}{i}" for k, i in self.shared)] if self.shared else [])
          + ([";".join(f"{r}:{x.key()}" for x, r in self.outputs)] if self.outputs else []))
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def arrays(self) -> list[str]:
        """Names of the term arrays the kernel takes, in layout order."""
        return [f"{LEAF_ARRAY[k]}{i}" for k, i, _ in self.layout]

    def grad_names(self) -> list[str]:
        return [f"g{LEAF_ARRAY[k]}{i}" for k, i in self.grads]

    def grad_roots(self) -> list[tuple[str, int, EdgeExpr]]:
        """``(kind, index, d expr / d leaf)`` of every leaf in :attr:`grads`."""
        return [(k, i, derivative(self.expr, (k, i))) for k, i in self.grads]

    def multi_grad_roots(self) -> list[tuple[str, int, tuple[EdgeExpr, ...]]]:
        """``(kind, index, (d expr_j / d leaf for each output j))`` of every leaf in
        :attr:`grads` (a kernel with :attr:`outputs`)."""
        return [(k, i, tuple(derivative(x, (k, i)) for x, _ in self.outputs))
                for k, i in self.grads]

    def header(self, generator: str, version: str) -> list[str]:
        """The docstring lines every generated module opens with."""
        lines = [
            f'"""Generated by {generator} (v{version}); do not edit.',
            "",
            f"kind: {self.kind}   reduce: {self.reduce}",
            *([f"expr: {self.expr}"] if not self.outputs else
              [f"output {j}: {r} of {x}" for j, (x, r) in enumerate(self.outputs)]),
            "layout: " + ", ".join(f"{k}{i}[{'F' if wd else '1'}]" for k, i, wd in self.layout),
        ]
        if self.grads:
            lines.append("grads: " + ", ".join(f"{k}{i}" for k, i in self.grads))
        if self.shared:
            lines.append("shared rows: " + ", ".join(f"{k}{i}" for k, i in self.shared))
        return lines + ['"""']


def cache_dir(target: str) -> Path:
    """Where generated kernel modules of ``target`` (``"numba"``, ``"triton"``) live."""
    with _LOCK:
        if target not in _CACHE_DIRS:
            root = get("NGRA_CACHE")
            base = Path(root).expanduser() if root else Path.home() / ".cache" / "ngra"
            path = base / target
            try:
                path.mkdir(parents=True, exist_ok=True)
                probe = path / f".probe-{os.getpid()}"
                probe.write_text("")
                probe.unlink()
            except OSError as exc:
                path = Path(tempfile.mkdtemp(prefix=f"ngra-{target}-"))
                log.warning("kernel cache %s not writable (%s); using %s", base, exc, path)
            _CACHE_DIRS[target] = path
        return _CACHE_DIRS[target]


def _write_module(path: Path, source: str) -> None:
    # Rewriting an identical file would change its mtime and invalidate numba's
    # cache index (keyed by the source file's stamp): write only when absent/different.
    try:
        if path.read_text() == source:
            return
    except OSError:
        pass
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(source)
    os.replace(tmp, path)


def load_module(target: str, name: str, source: str) -> ModuleType:
    """``source`` saved as ``<cache_dir(target)>/<name>.py`` and imported as ``name``."""
    path = cache_dir(target) / f"{name}.py"
    _write_module(path, source)
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module
