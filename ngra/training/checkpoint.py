"""Training checkpoints that survive crashes and damaged files.

A checkpoint folder holds ``checkpoint.pt`` (the newest) and ``checkpoint.prev.pt``
(the one before it). :func:`save_checkpoint` writes the new file under a temporary
name and flushes it to disk, then renames the current ``checkpoint.pt`` to
``checkpoint.prev.pt`` and the new file to ``checkpoint.pt``: at every moment the
folder holds at least one complete checkpoint, and a crash mid-write leaves only a
temporary file behind. The temporary's name carries its writer's host and pid
(``.ckpt-@host~pid@<random>.tmp``); the next save removes those of writers that are gone
and logs the space freed. The new file's bytes (the state's tensors and a margin) are
reserved before it is written: on a full disk :func:`save_checkpoint` raises
:class:`~ngra.errors.DiskFullError` (the bytes needed, the folder) and leaves the folder
as it was.

:func:`load_checkpoint` verifies a file before trusting it: a torch checkpoint is a
zip archive whose members carry CRC-32 checksums, which torch itself does not check
(a flipped bit in a weight loads silently), so every member's checksum is tested
first, then the file is unpickled and the keys the caller needs are checked.
:func:`load_latest_checkpoint` falls back to ``checkpoint.prev.pt`` with a warning
when the newest is damaged or missing; a damaged newest file is renamed to
``checkpoint.pt.damaged``, so that the next save keeps the intact one as previous.

A checkpoint holds plain tensors, numbers, strings, lists and dicts only, and is read
with ``torch.load(..., weights_only=True)`` (no code runs while loading): ``model`` is
the **selected** weights (the epoch with the best validation accuracy), ``last`` the
last epoch's (what a resumed run continues from), ``meta`` what rebuilds the model
(:func:`ngra.load_model`: the zoo name or factory, its arguments, the feature
normalization, the dataset's fingerprint), and the optimizer, history and every RNG's
state (:func:`rng_state`: numpy's as a tensor).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import random

import numpy as np
import torch

from ngra.diskspace import collect_leftovers, disk_full_error, reserve, sync_folder, writer_tag
from ngra.errors import CheckpointError

__all__ = [
    "CHECKPOINT_NAME",
    "FORMAT_VERSION",
    "PREVIOUS_NAME",
    "load_checkpoint",
    "load_latest_checkpoint",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

log = logging.getLogger(__name__)

#: The newest checkpoint in a checkpoint folder.
CHECKPOINT_NAME = "checkpoint.pt"
#: The checkpoint before it, kept until the next save.
PREVIOUS_NAME = "checkpoint.prev.pt"
#: The layout of a training checkpoint (2: selected weights as ``model``, ``last``,
#: ``meta``, read with ``weights_only=True``).
FORMAT_VERSION = 2


def rng_state() -> dict[str, Any]:
    """Every RNG's state as plain values (torch's and CUDA's tensors, numpy's key as a
    tensor, Python's tuple)."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(),
             "numpy": [kind, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss),
                       float(gauss)],
             "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()  # the gpu kernels' dropout seeds
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    kind, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def save_checkpoint(state: dict[str, Any], directory: str | os.PathLike[str]) -> Path:
    """Write ``state`` as ``directory/checkpoint.pt``, keeping the previous one as
    ``checkpoint.prev.pt``. Returns the new file's path.

    ``SIGINT`` and ``SIGTERM`` arriving meanwhile take effect when the save is complete
    (:func:`_signals_deferred`): a save is never cut in half, and the interrupted run's
    last checkpoint is this one."""
    with _signals_deferred():
        return _save(state, directory)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold ``SIGINT``/``SIGTERM`` inside the block and deliver them to the handlers in
    place before it when it ends (main thread only: Python runs handlers there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.getsignal(s) for s in sigs}
    for s in sigs:
        signal.signal(s, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
    if pending:
        handler = before[pending[0]]
        if callable(handler):
            handler(pending[0], None)  # Python's default for SIGINT raises KeyboardInterrupt
        elif handler != signal.SIG_IGN:
            signal.raise_signal(pending[0])


def _save(state: dict[str, Any], directory: str | os.PathLike[str]) -> Path:
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    collect_leftovers(folder, [".ckpt-*.tmp"], "partial checkpoint files")
    path, prev = folder / CHECKPOINT_NAME, folder / PREVIOUS_NAME
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".ckpt-{writer_tag()}", suffix=".tmp")
    needed = _state_bytes(state) + _MARGIN
    try:
        with os.fdopen(fd, "wb") as f:
            reserve(f.fileno(), needed, "a checkpoint", folder)
            torch.save(state, f)
            f.truncate()  # the reserved bytes past the archive's end
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before a rename makes it the checkpoint
        if path.exists():
            os.replace(path, prev)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        full = disk_full_error(err, "a checkpoint", folder, needed)
        if full is not None and full is not err:
            raise full from None
        raise
    sync_folder(folder)
    return path


#: Bytes reserved for a checkpoint beyond its tensors' data (zip headers, pickled metadata).
_MARGIN = 1 << 20


def _state_bytes(obj: Any) -> int:
    """The bytes of the tensors and arrays in a nested state (each storage once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            key = (st.data_ptr(), st.nbytes())
            if key not in seen:
                seen.add(key)
                total += st.nbytes()
        elif isinstance(o, np.ndarray):
            total += o.nbytes
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
    return total


def load_checkpoint(path: str | os.PathLike[str], required: Iterable[str] = ()) -> dict[str, Any]:
    """Read and verify one checkpoint file.

    Args:
        path: the file.
        required: keys the checkpoint must hold.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: the file is damaged (truncated, a checksum mismatch, not a
            torch checkpoint) or lacks a required key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}.")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            raise ValueError(f"checksum mismatch in its member {bad}")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as err:  # zipfile, torch and pickle fail in many ways on damaged bytes
        raise CheckpointError(path, f"checkpoint {path} is damaged ({_reason(err)}).") from None
    missing = [k for k in required if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(
            path, f"checkpoint {path} is damaged or not an ngra checkpoint: it lacks {missing}."
        )
    return state


def load_latest_checkpoint(
    directory: str | os.PathLike[str], required: Iterable[str] = ()
) -> tuple[dict[str, Any], Path]:
    """The newest intact checkpoint in ``directory`` and its path.

    ``checkpoint.pt`` is read first; when it is damaged or missing, ``checkpoint.prev.pt``
    is used with a warning.

    Raises:
        FileNotFoundError: the folder holds neither file.
        CheckpointError: every file there is damaged (the message names each and the fix).
    """
    folder = Path(directory)
    required = tuple(required)
    candidates = [folder / CHECKPOINT_NAME, folder / PREVIOUS_NAME]
    if not any(p.is_file() for p in candidates):
        raise FileNotFoundError(
            f"no checkpoint in {folder} (looked for {CHECKPOINT_NAME} and {PREVIOUS_NAME})."
        )
    problems = []
    for path in candidates:
        if not path.is_file():
            problems.append(f"{path.name} is missing")
            continue
        try:
            state = load_checkpoint(path, required)
        except CheckpointError as err:
            problems.append(str(err).rstrip("."))
            continue
        if problems:
            aside = _set_aside(candidates[0])
            log.warning("%s%s; resuming from %s instead", "; ".join(problems),
                        f" (moved to {aside.name})" if aside else "", path)
        return state, path
    raise CheckpointError(
        candidates[0],
        f"no intact checkpoint in {folder}: {'; '.join(problems)}. Start over without "
        "--resume (the next save replaces the damaged files), or restore the folder from a "
        "backup.",
    )


def _set_aside(path: Path) -> Path | None:
    """Rename a damaged newest checkpoint so the next save does not demote it over the
    intact previous one. Returns the new name (``None`` if there was nothing to move)."""
    if not path.is_file():
        return None
    aside = path.with_name(path.name + ".damaged")
    try:
        os.replace(path, aside)
    except OSError:
        return None
    return aside


def _reason(err: Exception) -> str:
    text = str(err).split("\n")[0].split(". ")[0]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
