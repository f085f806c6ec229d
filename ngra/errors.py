"""The exception types ngra raises on bad input, damaged files and failed training.

Each error message says what was expected, what arrived and how to fix it. Every
type derives from a builtin one (``ValueError``, ``FileNotFoundError``, ``OSError``,
``RuntimeError``), so code that already catches those keeps working. Bad arguments
to :class:`ngra.Graph` and to layer calls raise plain ``ValueError`` / ``TypeError``.

This module imports nothing heavy: ``ngra.datasets`` and ``ngra.training.run`` raise these
and ``ngra`` exports them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CheckpointError",
    "DamagedFileError",
    "DatasetError",
    "DatasetNotFoundError",
    "DiskFullError",
    "DistributedError",
    "DownloadError",
    "SpecError",
    "TrainingDivergedError",
]


class DatasetError(ValueError):
    """A dataset could not be built from what was given (bad file contents, bad arguments),
    or cannot train (no labelled vertices, an empty split, one class, non-finite features)."""


class SpecError(DatasetError):
    """A dataset spec string (``"rmat:scale=18,seed=0"``) could not be parsed."""


class DatasetNotFoundError(FileNotFoundError):
    """Raw files a loader needs are missing (and could not be downloaded)."""


class DownloadError(OSError):
    """A file could not be downloaded, or its checksum did not match."""


class DamagedFileError(DatasetError):
    """A dataset file exists but is damaged: truncated, corrupted or cut short.

    Attributes:
        path: the damaged file.
    """

    def __init__(self, path: str | Path, message: str) -> None:
        super().__init__(message)
        self.path = Path(path)

    def __reduce__(self) -> tuple:  # picklable across processes (the args are not (message,))
        return type(self), (self.path, str(self))


class DiskFullError(OSError):
    """A file could not be written for lack of disk space (or over the file-size limit):
    the message says what was being written, how many bytes it needed and where. What was
    partly written is removed; what was there before is untouched.

    Attributes:
        path: the file (or folder) being written.
        needed: the bytes it needed (``None`` when unknown).
    """

    def __init__(self, path: str | Path, needed: int | None, message: str,
                 errno_: int = 28) -> None:
        super().__init__(errno_, message)
        self.path = Path(path)
        self.needed = needed

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple:  # picklable across processes
        return type(self), (self.path, self.needed, str(self), self.errno)


class CheckpointError(ValueError):
    """A checkpoint cannot be resumed: damaged (every kept copy), or written by a run
    with another model, dataset or layer sizes.

    Attributes:
        path: the checkpoint file.
    """

    def __init__(self, path: str | Path, message: str) -> None:
        super().__init__(message)
        self.path = Path(path)

    def __reduce__(self) -> tuple:  # picklable across processes (the args are not (message,))
        return type(self), (self.path, str(self))


class TrainingDivergedError(RuntimeError):
    """Training produced a non-finite loss, gradient or output; the run stopped.

    Attributes:
        epoch: the 1-based epoch at which it diverged.
    """

    def __init__(self, epoch: int, message: str) -> None:
        super().__init__(message)
        self.epoch = epoch

    def __reduce__(self) -> tuple:
        return type(self), (self.epoch, str(self))


class DistributedError(RuntimeError):
    """A run over several processes failed; the message names the rank that caused it and
    why (a signal, or the rank's own error; the peers' connection errors come after).

    Attributes:
        cause: the exception type name of the rank's own error (``"ValueError"``), or
            ``None`` when the rank was killed or said nothing.
    """

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause

    def __reduce__(self) -> tuple:  # picklable across processes
        return type(self), (str(self), self.cause)
