"""The partition book a multi-process run trains with, and its cache.

:func:`partition_for` returns the book a run of ``parts`` ranks uses: a book folder the
user made (``ngra partition --out DIR``, passed as ``book_dir``), checked against the
dataset's graph and spec, or the book cached beside the dataset cache under a key of
the dataset, the relabeling, the method and the part count, rebuilt when it is missing,
damaged or stale. ``ngra train --nprocs`` and the planner's exchange pricing
(:func:`ngra.planner.train_plans.book_halos`) read the same books.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ngra.datasets.base import data_root as resolve_data_root
from ngra.datasets.cache import cache_key, cache_root
from ngra.partition import BookError, PartitionBook, build_book, check_book, load_book, save_book

__all__ = ["BOOK_SEED", "book_cache_folder", "partition_for"]

log = logging.getLogger(__name__)

#: The METIS seed of cached books (independent of a run's seed: one book serves every run).
BOOK_SEED = 0


def book_cache_folder(spec: str, parts: int, *, method: str, reorder: str,
                      data_root: str | None) -> Path:
    """Where the cached book of ``spec`` in ``parts`` parts lives."""
    name = f"{cache_key(spec)}-{reorder}-{method}-k{parts}-s{BOOK_SEED}"
    return cache_root(resolve_data_root(data_root)) / "partitions" / name


def partition_for(ds: Any, parts: int, *, spec: str, book_dir: str | None = None,
                  method: str = "metis", reorder: str = "none", data_root: str | None = None,
                  asked: str | None = None) -> tuple[PartitionBook, Path]:
    """``(book, folder)`` of ``ds`` (spec ``spec``) in ``parts`` parts: the book in
    ``book_dir``, checked against the dataset, else the cached one (built with ``method``
    when missing, damaged or stale). ``asked`` says where ``parts`` came from, for the
    error when ``book_dir``'s part count differs (default ``"--nprocs is"``).

    Raises:
        BookError: ``book_dir`` holds a book of another graph, or a stale one.
        ValueError: ``book_dir``'s book has another part count.
    """
    if book_dir:
        folder = Path(book_dir)
        book = load_book(folder)
        check_book(book, ds.graph, spec, where=f"the partition book in {folder}")
        if book.num_parts != parts:
            raise ValueError(f"the partition book in {folder} has {book.num_parts} parts; "
                             f"{asked or '--nprocs is'} {parts}. Make one with `ngra partition "
                             f"--dataset {spec} --parts {parts}`.")
        return book, folder
    folder = book_cache_folder(spec, parts, method=method, reorder=reorder, data_root=data_root)
    try:
        book = load_book(folder)
        check_book(book, ds.graph, spec)
        return book, folder
    except FileNotFoundError:
        pass
    except BookError as exc:
        log.info("rebuilding the cached partition book: %s", exc)
    book = build_book(ds.graph, parts, method, BOOK_SEED, spec=spec)
    save_book(book, folder)
    log.info("partition book cached in %s:\n%s", folder, book.describe())
    return book, folder
