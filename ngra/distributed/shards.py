"""Per-rank shards: the rows, in-edges and exchange lists one rank trains on.

Built once per dataset, model graph preparation and partition book by the process that
launches the ranks (or rank 0 under ``torchrun``), from the whole dataset, and written
beside the book; each rank then reads only its own shard, so no rank holds the whole
graph or feature matrix. A shard holds, for rank ``r`` owning ``D`` vertices with ``H``
halo rows:

* the local CSC over ``D + H`` rows (owned rows then halo rows; see
  :class:`~ngra.distributed.graph.DistGraph`), its edge weights and the model's edge
  data in local CSC order, and each local edge's id in the prepared graph's edge order;
* the owned rows of the features, labels and split masks, with their original vertex
  ids (dropout masks are drawn by these ids: the same masks on any number of ranks);
* the halo exchange lists (rows to send to each rank, rows received from each);

and ``meta.json`` the figures every rank shares: the partition's statistics for the
cost model, the dataset's sizes, and stamps (book and data fingerprints, the model's
graph preparation) so that a shard of another dataset, book or preparation is rebuilt,
never read.

Integrity: ``meta.json`` records each shard file's size and BLAKE2b digest, and a digest
of itself. Shards are verified like dataset cache entries: the first time they are opened
after being written or modified (a full read), then only by ``stat`` against the stamp of
the verified state (``verified.json``: each file's size, mtime and inode).
:func:`shards_current` treats a damaged or swapped file as stale (it is rebuilt, with a
warning naming it); :func:`load_shard` refuses one with a
:class:`~ngra.errors.DamagedFileError` naming the file, and each shard records its own
rank and rank count, so a shard of another rank is never trained on.

Writes: each file is written whole or not at all (:func:`~ngra.diskspace.atomic_output`:
a temporary beside it, tagged with the writer's host and pid, its bytes reserved, renamed
into place), so a full disk is a :class:`~ngra.errors.DiskFullError` naming the file and
leaves nothing half-written; the temporaries of a writer that was killed (a ``--nprocs``
run SIGKILLed while it built the shards) are removed by the next run that looks at the
folder (:func:`collect_shard_leftovers`), which logs the bytes freed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ngra.diskspace import atomic_output, collect_leftovers, write_file
from ngra.errors import DamagedFileError
from ngra.distributed.cost import PartitionStats
from ngra.distributed.halo import HaloPlan
from ngra.graph import EdgeFactors, Graph
from ngra.idtype import narrow
from ngra.memstat import rss_bytes
from ngra.partition import PartitionBook, permute_graph
from ngra.models import MODELS
from ngra.models import prepare

__all__ = ["Shard", "build_shards", "collect_shard_leftovers", "data_fingerprint", "load_shard",
           "prep_key", "shard_sizes", "shards_current"]

log = logging.getLogger(__name__)

SHARD_VERSION = 5  # 3: 32-bit structure and edge ids; 4: GCN's weights as factors;
#   5: checksums of the shards and of meta.json, each shard's rank
_VERIFIED = "verified.json"
_HASH_BLOCK = 16 << 20


def prep_key(model: Any) -> str:
    """What the model's graph preparation depends on (its edge data and self-loops):
    ``model`` is a zoo name, or anything with ``prep_key()`` (a training ``ModelSource``)."""

    if not isinstance(model, str):
        return model.prep_key()
    spec = MODELS[model]
    return f"{spec.edge_data}{'+self_loops' if spec.self_loops else ''}"


def _prepare(model: Any, ds: Any) -> tuple[Any, Any]:
    """``(graph, edge_data)`` ``model`` trains on: a zoo name's preparation, or
    ``model.prepare(graph, edge_type, num_edge_types)``."""

    if isinstance(model, str):
        return prepare(model, ds.graph, ds.edge_type, ds.num_edge_types)
    return model.prepare(ds.graph, ds.edge_type, ds.num_edge_types)


def data_fingerprint(ds: Any) -> str:
    """A hash of the dataset's vertex data, labels, splits and edge types."""
    h = hashlib.blake2b(digest_size=16)
    for t in (ds.x, ds.y, ds.train_mask, ds.val_mask, ds.test_mask, ds.edge_type):
        if t is None:
            h.update(b"-")
            continue
        t = t.contiguous()
        h.update(f"{t.dtype}{list(t.shape)}".encode())
        flat = t.view(-1)
        step = 1 << 24
        for i in range(0, flat.numel(), step):
            h.update(flat[i:i + step].numpy().tobytes())
    return h.hexdigest()


def _stamp(ds: Any, model: Any, book: PartitionBook) -> dict[str, Any]:
    return {"version": SHARD_VERSION, "parts": book.num_parts, "book": book.fingerprint,
            "method": book.method, "data": data_fingerprint(ds), "prep": prep_key(model)}


def _file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _meta_digest(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.blake2b(json.dumps(body, sort_keys=True).encode(), digest_size=16).hexdigest()


def _read_meta(folder: Path) -> dict[str, Any]:
    """``meta.json``, checked against its own digest (:class:`DamagedFileError` if not)."""
    path = folder / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except ValueError as err:
        raise DamagedFileError(path, f"shard metadata {path} is damaged ({err}).") from None
    if not isinstance(meta, dict) or meta.get("checksum") != _meta_digest(meta):
        raise DamagedFileError(path, f"shard metadata {path} does not match its checksum.")
    return meta


def _file_stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _check_file(folder: Path, name: str, meta: dict[str, Any], verified: dict[str, Any]) -> str:
    """Why shard file ``name`` cannot be trusted ("" when it can): missing, of another
    size, or (when not verified since it last changed) of another digest."""
    path = folder / name
    want = meta.get("files", {}).get(name)
    if want is None:
        return f"{path} is not listed in {folder / 'meta.json'}"
    try:
        stamp = _file_stamp(path)
    except OSError:
        return f"{path} is missing"
    if stamp[0] != want["size"]:
        return (f"{path} has {stamp[0]} bytes, not the {want['size']} written "
                "(truncated or replaced)")
    if verified.get(name) == stamp:
        return ""
    if _file_digest(path) != want["blake2b"]:
        return f"{path} does not match its checksum (damaged, or another rank's shard)"
    return ""


def _read_verified(folder: Path) -> dict[str, Any]:
    try:
        v = json.loads((folder / _VERIFIED).read_text())
    except (OSError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


def _write_verified(folder: Path, names: list[str]) -> None:
    try:
        stamps = {n: _file_stamp(folder / n) for n in names}
        write_file(folder / _VERIFIED, json.dumps(stamps), "the shards' verified stamps")
    except OSError:
        pass  # a read-only folder or a full disk: verified again next time


def collect_shard_leftovers(folder: str | os.PathLike[str]) -> int:
    """Remove what killed shard writers left in ``folder`` (a ``--nprocs`` run SIGKILLed
    while it wrote the shards: their temporaries, tagged with its host and pid, or an
    older ngra's untagged ones a day old); logs and returns the bytes freed."""
    return collect_leftovers(folder, [".rank*.pt.*tmp*", ".meta.json.*tmp*",
                                      f".{_VERIFIED}.*tmp*"], "partial shard files")


def shards_current(folder: Path, ds: Any, model: Any, book: PartitionBook) -> bool:
    """Whether ``folder`` holds intact shards of exactly this dataset, model preparation
    and book (a damaged or swapped file is logged, naming it, and counts as stale)."""
    folder = Path(folder)
    collect_shard_leftovers(folder)
    if not (folder / "meta.json").is_file():
        return False
    try:
        meta = _read_meta(folder)
    except (OSError, DamagedFileError) as err:
        log.warning("%s; rebuilding the shards", err)
        return False
    if meta.get("stamp") != _stamp(ds, model, book):
        return False
    names = [f"rank{r}.pt" for r in range(book.num_parts)]
    verified = _read_verified(folder)
    for name in names:
        why = _check_file(folder, name, meta, verified)
        if why:
            log.warning("%s; rebuilding the shards in %s", why, folder)
            return False
    if any(verified.get(n) != _file_stamp(folder / n) for n in names):
        _write_verified(folder, names)
    return True


def shard_sizes(folder: str | os.PathLike[str]) -> list[tuple[int, int, int]]:
    """``(bytes, rows, in-edges)`` of each rank's shard in ``folder``, by rank (from its
    ``meta.json``, checked against its digest)."""
    meta = _read_meta(Path(folder))
    stats = meta["stats"]
    return [(int(meta["files"][f"rank{r}.pt"]["size"]), int(rows), int(sum(stats["edges"][r])))
            for r, rows in enumerate(stats["rows"])]


def build_shards(ds: Any, model: Any, book: PartitionBook, folder: str | os.PathLike[str],
                 progress: bool = False) -> Path:
    """Write every rank's shard of ``ds`` prepared for ``model`` (a zoo name, or a
    training ``ModelSource``) under ``book``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    collect_shard_leftovers(folder)
    graph, edge_data = _prepare(model, ds)
    factors = graph.edge_factors  # GCN's weights: per-vertex factors, not per-edge weights
    rg = permute_graph(graph.with_edge_weight(None) if factors is not None else graph,
                       book.reordering)
    ip = rg.indptr.to(torch.int64)
    order = book.reordering.order
    k = book.num_parts
    rows = (book.bounds[1:] - book.bounds[:-1])
    sent = torch.zeros(k, dtype=torch.int64)
    received = torch.zeros(k, dtype=torch.int64)
    edges = torch.zeros(k, k, dtype=torch.int64)
    new_owner = torch.repeat_interleave(torch.arange(k), rows)
    files: dict[str, dict[str, Any]] = {}
    (folder / _VERIFIED).unlink(missing_ok=True)
    for r in tqdm(range(k), desc="shards", disable=not progress):
        lo, hi = book.owned(r)
        e0, e1 = int(ip[lo]), int(ip[hi])
        src = rg.indices[e0:e1].to(torch.int64)
        halo = book.halo_of(r)
        local_src = book.to_local(r, src)
        if local_src.numel() and int(local_src.min()) < 0:
            raise AssertionError(f"rank {r}: the model's graph reads a source outside the "
                                 "book's halo (the book is not this graph's)")
        d, h = hi - lo, halo.numel()
        indptr = narrow(torch.cat([ip[lo:hi + 1] - e0,
                                   torch.full((h,), e1 - e0, dtype=torch.int64)]), e1 - e0)
        local_src = narrow(local_src, d + h - 1)
        gids = narrow(rg.perm[e0:e1], graph.num_edges)
        send = [book.send_rows(r, p) for p in range(k)]
        recv = book.recv_counts(r)
        sent[r], received[r] = sum(s.numel() for s in send), sum(recv)
        edges[r] = torch.bincount(new_owner[src], minlength=k)
        rows_orig = order[lo:hi]
        shard = {
            "indptr": indptr, "indices": local_src, "edge_ids": gids,
            "edge_weight": (None if rg.edge_weight is None or factors is not None
                            else rg.edge_weight[e0:e1]),
            **_local_factors(factors, order, lo, hi, halo),
            "edge_data": _take_edges(edge_data, gids),
            "halo": halo, "send_idx": torch.cat(send), "send_counts": [s.numel() for s in send],
            "recv_counts": recv, "row_ids": rows_orig, "x": ds.x[rows_orig],
            "y": ds.y[rows_orig], "train_mask": ds.train_mask[rows_orig],
            "val_mask": ds.val_mask[rows_orig], "test_mask": ds.test_mask[rows_orig],
            "num_own": d, "rank": r, "parts": k,
        }
        name = f"rank{r}.pt"
        _save(shard, folder / name)
        files[name] = {"size": (folder / name).stat().st_size,
                       "blake2b": _file_digest(folder / name)}
    meta = {
        "stamp": _stamp(ds, model, book), "spec": ds.info.get("spec"),
        "bounds": book.bounds.tolist(),
        "stats": {"rows": rows.tolist(), "sent": sent.tolist(), "received": received.tolist(),
                  "edges": edges.tolist()},
        "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
        "num_features": int(ds.x.shape[1]), "num_classes": int(ds.num_classes),
        "num_edge_types": int(ds.num_edge_types),
        "split_sizes": {k_: int(m.sum()) for k_, m in (("train", ds.train_mask),
                                                         ("val", ds.val_mask),
                                                         ("test", ds.test_mask))},
        "figures": book.figures(),
        "files": files,
    }
    meta["checksum"] = _meta_digest(meta)
    write_file(folder / "meta.json", json.dumps(meta, indent=1) + "\n", "the shards' metadata")
    return folder


def _local_factors(factors: Any, order: torch.Tensor, lo: int, hi: int,
                   halo: torch.Tensor) -> dict[str, torch.Tensor]:
    """A rank's share of factored edge weights (``src[u] * dst[v]``): the source factor
    of each local row (owned, then halo) and the destination factor of each owned row
    (halo rows, which have no in-edges, get 0); the book's new ids through ``order``."""
    if factors is None:
        return {}
    rows = order[torch.cat([torch.arange(lo, hi, dtype=torch.int64), halo.to(torch.int64)])]
    dst = torch.zeros(rows.numel(), dtype=factors.dst.dtype)
    dst[: hi - lo] = factors.dst[order[lo:hi]]
    return {"src_factor": factors.src[rows], "dst_factor": dst}


def _take_edges(edge_data: Any, ids: torch.Tensor) -> Any:
    if edge_data is None:
        return None
    if isinstance(edge_data, dict):
        return {k: v.index_select(0, ids) for k, v in edge_data.items()}
    return edge_data.index_select(0, ids)


def _save(obj: dict[str, Any], path: Path) -> None:
    """``obj`` to ``path`` whole or not at all (:func:`~ngra.diskspace.atomic_output`, its
    bytes reserved), each tensor with only its own elements: a slice of a larger tensor
    (``perm[e0:e1]``) would otherwise carry its whole storage into the file, and into the
    rank's memory when loaded."""
    obj = {k: _own(v) for k, v in obj.items()}
    needed = _tensor_bytes(obj) + (1 << 20)  # and the archive's headers and pickle
    with atomic_output(path, f"the shard {path.name}", needed) as fh:
        torch.save(obj, fh)


def _tensor_bytes(v: Any) -> int:
    if isinstance(v, dict):
        return sum(_tensor_bytes(t) for t in v.values())
    return v.nbytes if isinstance(v, torch.Tensor) else 0


def _own(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _own(t) for k, t in v.items()}
    if isinstance(v, torch.Tensor) and v.untyped_storage().nbytes() > v.nbytes:
        return v.clone()
    return v


@dataclass
class Shard:
    """What one rank trains on (see the module docstring)."""

    graph: Any  # DistGraph
    x: torch.Tensor
    y: torch.Tensor
    masks: dict[str, torch.Tensor]
    edge_data: Any
    row_ids: torch.Tensor
    meta: dict[str, Any]
    start_rss: int | None = None  # the rank's RSS before it loaded the shard (bytes)

    def to(self, device: torch.device | str) -> Shard:
        """The shard's graph and data on ``device`` (``row_ids`` too: dropout reads them)."""
        device = torch.device(device)

        def move(v: Any) -> Any:
            if isinstance(v, dict):
                return {k: t.to(device) for k, t in v.items()}
            return None if v is None else v.to(device)

        return Shard(self.graph.to(device), move(self.x), move(self.y), move(self.masks),
                     move(self.edge_data), move(self.row_ids), self.meta, self.start_rss)


def load_shard(folder: str | os.PathLike[str], rank: int, world_size: int, *, group: Any = None,
               exchange: str = "auto", link: Any = None, overlap: bool = True,
               halo_bits: int | None = None, staleness: int = 0) -> Shard:
    """Rank ``rank``'s shard from ``folder`` as a :class:`Shard` with its ``DistGraph``
    (``overlap``: its halo exchange overlaps the inner edges' compute, else blocks;
    ``halo_bits``: its halo rows travel quantized to that many bits, else exact;
    ``staleness``: 1 for a step's halo one step late, else 0)."""
    from ngra.distributed.graph import DistGraph

    folder = Path(folder)
    start = rss_bytes()  # before the shard: the fixed part the rank's summary reports
    meta = _read_meta(folder)
    if meta["stamp"]["parts"] != world_size:
        raise ValueError(f"the shards in {folder} are for {meta['stamp']['parts']} ranks, "
                         f"not {world_size}.")
    path = folder / f"rank{rank}.pt"
    fix = "delete the folder and run again: the shards are rebuilt from the dataset."
    why = _check_file(folder, path.name, meta, _read_verified(folder))
    if why:
        raise DamagedFileError(path, f"{why}; {fix}")
    # mapped, not read: pages come in as they are touched (a GCN never reads edge_ids)
    s = torch.load(path, weights_only=True, mmap=True)
    if (s.get("rank"), s.get("parts")) != (rank, world_size):
        raise DamagedFileError(path, f"{path} is rank {s.get('rank')} of {s.get('parts')}'s "
                               f"shard, not rank {rank} of {world_size}'s; {fix}")
    d, h = int(s["num_own"]), int(s["halo"].numel())
    factors = EdgeFactors(s["src_factor"], s["dst_factor"]) if "src_factor" in s else None
    local = Graph(s["indptr"], s["indices"], None, d + h, s["edge_weight"], factors)  # CSC order
    halo = HaloPlan(d, h, s["send_idx"], list(s["send_counts"]), list(s["recv_counts"]))
    graph = DistGraph(local, d, s["halo"], torch.tensor(meta["bounds"]), halo,
                      PartitionStats.from_dict(meta["stats"]),
                      rank=rank, world_size=world_size, group=group, exchange=exchange,
                      link=link, edge_ids=s["edge_ids"], overlap=overlap,
                      halo_bits=halo_bits, staleness=staleness)
    masks = {"train": s["train_mask"], "val": s["val_mask"], "test": s["test_mask"]}
    return Shard(graph, s["x"], s["y"], masks, s["edge_data"], s["row_ids"], meta, start)
