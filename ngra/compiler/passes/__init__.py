"""Compiler passes, one a file, assembled in :mod:`ngra.compiler.pipeline`.

Each pass takes an annotated :class:`~ngra.compiler.ir.Program`, rewrites it in
place, and returns a :class:`PassNote` saying whether it fired and why (or why not).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PassNote"]


@dataclass
class PassNote:
    """What one pass did, for ``explain``.

    Attributes:
        name: the pass (``trace``, ``hoist``, ``reorder``, ``fuse``).
        fired: it changed the program (or, for ``fuse``, matched a kernel).
        summary: one line.
        details: further lines (hoisted terms with shapes, reasons a pattern did not match).
    """

    name: str
    fired: bool
    summary: str
    details: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        if self.name == "trace":
            state = "ok" if self.fired else "failed"
        else:
            state = "fired" if self.fired else "skipped"
        out = [f"  {self.name:<8} {state}: {self.summary}"]
        out += [f"             {d}" for d in self.details]
        return out
