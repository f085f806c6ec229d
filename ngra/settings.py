"""Every knob of ngra in one place: the ``NGRA_*`` environment variables and the scoped
(context-manager) settings.

Environment variables are declared once, in :data:`SETTINGS`, and read through
:func:`get` **when a value is used**, never at import: a bad value raises a
``ValueError`` that names the variable, what it accepts and what arrived, at the call
that needs it, and ``import ngra`` works whatever the environment holds. An empty
variable counts as unset. ``ngra info`` prints :func:`resolved` (each variable's value
and whether it came from the environment or the default) and :data:`SCOPED`.

Scoped settings apply to the calling thread inside a ``with`` block (two, the compiler's
``disabled`` and ``strict``, to the whole process); their implementations stay
beside the code they steer, and :data:`SCOPED` says where each lives and what it does.

This module imports only the standard library, so every layer of ngra may read it.

Example::

    from ngra.settings import get
    backend = get("NGRA_KERNEL_BACKEND")  # "auto" unless the environment says otherwise
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

__all__ = ["SCOPED", "SETTINGS", "Resolved", "Setting", "get", "resolved"]


@dataclass(frozen=True)
class Setting:
    """One ``NGRA_*`` environment variable.

    Args:
        name: the variable, ``NGRA_...``.
        default: the value :func:`get` returns when the variable is unset or empty.
        doc: what it does, in a sentence or two (``ngra info`` and the README print it).
        parse: the raw string to a value; raises ``ValueError`` on a bad one.
        expected: what ``parse`` accepts, in words ("one of auto, ref, cpu, gpu").
        read_by: the modules that read it.
    """

    name: str
    default: object
    doc: str
    parse: Callable[[str], object]
    expected: str
    read_by: tuple[str, ...]


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in allowed:
            raise ValueError(raw)
        return raw
    return parse


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(raw: str) -> bool:
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise ValueError(raw)


def _int(raw: str) -> int:
    return int(raw)


def _count(raw: str) -> int:
    n = int(raw)
    if n < 0:
        raise ValueError(raw)
    return n


_SETTINGS = (
    Setting(
        "NGRA_KERNEL_BACKEND", "auto",
        "Kernel backend for every sparse op: auto picks per device (cpu: numba, cuda: gpu); "
        "ref is the plain-torch specification. ngra.kernels.use_backend(...) overrides it "
        "inside a block.",
        _choice("auto", "ref", "cpu", "gpu"), "one of auto, ref, cpu, gpu",
        ("ngra.kernels.registry",)),
    Setting(
        "NGRA_DST_PARTIALS", "auto",
        "Whether fused edge kernels sum the dst terms' partial derivatives in the forward: "
        "auto where the backend says they pay, always, or never (benchmarks, A/B runs).",
        _choice("auto", "always", "never"), "one of auto, always, never",
        ("ngra.kernels.fused_edge",)),
    Setting(
        "NGRA_AVX512", True,
        "On AVX-512 hosts, let numba generate 512-bit vector code: when ngra.kernels.cpu is "
        "first imported it sets NUMBA_CPU_FEATURES (host features + -prefer-256-bit) in this "
        "process's environment, so worker processes compile the same code, and logs that at "
        "INFO. 0 leaves numba's target alone; so does a NUMBA_CPU_FEATURES or NUMBA_CPU_NAME "
        "of your own.",
        _flag, "1 or 0 (also true/false, yes/no, on/off)",
        ("ngra.kernels.cpu._target",)),
    Setting(
        "NGRA_CACHE", None,
        "Cache folder. Holds the dataset cache entries, and numba/ and triton/ with the "
        "generated fused-edge kernel modules (numba's compiled machine code for them sits in "
        "numba/__pycache__). Unset: datasets cache in <data root>/cache (~/.ngra/cache if "
        "the data root is read-only), kernels in ~/.cache/ngra.",
        Path, "a folder path",
        ("ngra.datasets.cache", "ngra.kernels._edge_spec")),
    Setting(
        "NGRA_DATA", Path("~/.ngra/data"),
        "Data root where datasets are read and downloaded; --data-root wins over it.",
        Path, "a folder path",
        ("ngra.datasets.base",)),
    Setting(
        "NGRA_CALIBRATION", Path("~/.ngra/calibration"),
        "Folder of this host's measured machine figures (link model, pinned copy "
        "bandwidth), one JSON file each.",
        Path, "a folder path",
        ("ngra.calibration",)),
    Setting(
        "NGRA_EDGE_CHUNK", "auto",
        "Edges per chunk of an edge stage that no kernel fuses (the interpreted edge stage, "
        "the generic plan's apply_edge): it runs a chunk of destination-sorted edges at a "
        "time, and backward recomputes each chunk but the last (whose graph the forward "
        "keeps), so no [E, F] tensor outlives a chunk. auto makes as few equal chunks as "
        "keep a chunk's per-edge rows within ngra.compiler.chunked.CHUNK_BYTES; "
        "0 runs the stage over every edge at once (the whole-edge path).",
        lambda raw: "auto" if raw == "auto" else _count(raw), "auto or an integer >= 0",
        ("ngra.compiler.chunked",)),
    Setting(
        "NGRA_STRICT_PASSES", False,
        "A compiler pass that raises fails the layer call instead of sending the layer to "
        "the generic plan (as inside ngra.compiler.strict(); the test suite's default). "
        "Unset: the error is logged and the layer runs generic, with the same results.",
        _flag, "1 or 0 (also true/false, yes/no, on/off)",
        ("ngra.compiler.pipeline",)),
    Setting(
        "NGRA_TEST_SEED", None,
        "Tests only: the random seed of the kernel tests' gen fixture (unset: a fresh seed "
        "per test, printed so a failure can be replayed).",
        _int, "an integer",
        ("tests/kernels/conftest.py",)),
    Setting(
        "NGRA_HYPOTHESIS_PROFILE", "ci",
        "Tests only: hypothesis profile, ci (25 examples, derandomized) or thorough "
        "(400 examples; make test-all).",
        _choice("ci", "thorough"), "one of ci, thorough",
        ("tests/conftest.py",)),
)

#: Every ``NGRA_*`` environment variable, by name.
SETTINGS: dict[str, Setting] = {s.name: s for s in _SETTINGS}

#: The scoped settings: ``name -> "module.path.function: what it does inside the block"``.
#: Each is a context manager that applies to the calling thread (``disabled`` and ``strict``:
#: the whole process).
SCOPED: dict[str, str] = {
    "memory_budget": "ngra.runtime.budget.memory_budget: run every layer call within a tile "
                     "working set of this many bytes (also ngra.memory_budget)",
    "grid_shape": "ngra.runtime.budget.grid_shape: force a P x Q tile grid for every layer call "
                  "(tests, experiments; wins over a memory budget)",
    "device_streaming": "ngra.runtime.device_schedule.device_streaming: stream host-resident "
                        "vertex data through a device for every layer call",
    "staging_mode": "ngra.runtime.staging.staging_mode: force how tiles stage their source rows "
                    "(gather or span; tests, experiments)",
    "disabled": "ngra.compiler.driver.disabled: run every layer on the generic UDF executor "
                "(also ngra.compiler.disabled; process-wide)",
    "strict": "ngra.compiler.pipeline.strict: a compiler pass that raises fails the call instead "
              "of falling back to the generic plan (the test suite's default; process-wide)",
    "saved_on_disk": "ngra.spill.saved_on_disk: autograd's saved vertex arrays go to scratch "
                     "files",
    "use_backend": "ngra.kernels.registry.use_backend: force a kernel backend (wins over "
                   "NGRA_KERNEL_BACKEND)",
    "backward_only": "ngra.kernels.registry.backward_only: sum/mean kernels skip their forward "
                     "(internal: the chunked executor's per-tile backward)",
    "dropout_rows": "ngra.kernels.dropout.dropout_rows: draw dropout masks by global row id "
                    "(ranks of a distributed run draw the same masks)",
    "host_seed_draws": "ngra.kernels.dropout.host_seed_draws: collect the dropout seeds drawn on "
                       "the host (internal: CUDA graph capture checks)",
    "prefer_csc_walk": "ngra.kernels.transpose.prefer_csc_walk: backward passes walk the CSC "
                       "instead of building a reverse CSR (less memory, slower)",
    "keep_value": "ngra.kernels.attention_aggregate.keep_value: attention backward keeps the "
                  "value tensor intact (double backward)",
    "partials_judged_on": "ngra.kernels.fused_edge.partials_judged_on: judge whether dst "
                          "partials pay on another graph's offsets (internal: budget sampling)",
    "loading_spec": "ngra.datasets.direction.loading_spec: name the user's dataset spec in "
                    "advice to symmetrize (internal)",
}


def get(name: str) -> object:
    """The value of environment variable ``name``, read from the environment now.

    Args:
        name: a variable declared in :data:`SETTINGS`.

    Returns:
        The parsed value, or the setting's default when the variable is unset or empty.

    Raises:
        KeyError: ``name`` is not declared in :data:`SETTINGS`.
        ValueError: the variable holds a value its setting does not accept; the message
            names the variable, what it accepts and what arrived.
    """
    try:
        setting = SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name!r} is not an ngra setting; declared: {', '.join(SETTINGS)}.") \
            from None
    raw = os.environ.get(name, "")
    if raw == "":
        return setting.default
    try:
        return setting.parse(raw)
    except ValueError:
        raise ValueError(f"{name} must be {setting.expected}; got {raw!r}. Set it to one of "
                         f"those or unset it (default: {_show(setting.default)}).") from None


class Resolved(NamedTuple):
    """One row of :func:`resolved`."""

    name: str
    value: object
    source: str  # "env", "default", or "env (invalid: <what it accepts>)"
    doc: str


def resolved() -> list[Resolved]:
    """Every setting's value now: ``(name, value, source, doc)``, ``source`` ``"env"`` or
    ``"default"``. A bad value is reported, not raised: its row holds the raw string and
    the source ``"env (invalid: <what it accepts>)"``."""
    rows = []
    for s in SETTINGS.values():
        raw = os.environ.get(s.name, "")
        if raw == "":
            rows.append(Resolved(s.name, s.default, "default", s.doc))
            continue
        try:
            rows.append(Resolved(s.name, get(s.name), "env", s.doc))
        except ValueError:
            rows.append(Resolved(s.name, raw, f"env (invalid: expected {s.expected})", s.doc))
    return rows


def _show(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
