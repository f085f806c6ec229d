"""The training loop: one process's or one rank's, epochs, model selection, checkpoints.

:func:`fit` runs the loop over a :class:`Session`: the data and model it trains, how a
loss and accuracies are computed (and, on ranks of a partitioned run, reduced), and
whether this process writes files and shows progress. :func:`ngra.train.train` makes a
one-process session; :mod:`ngra.distributed.trainer` makes one per rank
(``RankSession``). A checkpoint holds the same state either way, so a run resumes on any
number of processes.

Checkpoints are written atomically (temp file + rename) every ``checkpoint_every``
epochs; ``resume=True`` restores model, optimizer, best state and every RNG, so a resumed
run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ngra.memstat import peak_rss_bytes
from ngra.runtime.budget import memory_budget
from ngra.runtime.placement import Placement, placed

if TYPE_CHECKING:
    from ngra.train import TrainConfig

__all__ = ["CKPT_NAME", "Session", "evaluate", "fit", "grid_report", "reorder_dataset"]

log = logging.getLogger(__name__)

CKPT_NAME = "checkpoint.pt"


def _peak_rss_mb() -> float:
    return peak_rss_bytes() / 2**20


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def _save_atomic(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ckpt-", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def reorder_dataset(ds: Any, method: str, seed: int = 0) -> Any:
    """The dataset with vertices relabeled for locality (see :mod:`ngra.partition.reorder`).

    Features, labels and masks are permuted with the graph; edge data given in the
    original edge order (edge types) still lines up.
    """
    from dataclasses import replace

    from ngra.partition import permute_graph, permute_rows, reorder

    r = reorder(ds.graph, method, seed=seed)
    return replace(ds, graph=permute_graph(ds.graph, r), x=permute_rows(ds.x, r),
                   y=permute_rows(ds.y, r), train_mask=permute_rows(ds.train_mask, r),
                   val_mask=permute_rows(ds.val_mask, r), test_mask=permute_rows(ds.test_mask, r))


@torch.no_grad()
def grid_report(model: torch.nn.Module, graph: Any, x: torch.Tensor, edge_data: Any) -> str:
    """The tile grid each layer call chose under the active memory budget, its predicted
    peak, and how its tiles are staged (gathered vs spanned source rows)."""
    from ngra.probes import Recorder

    model.eval()
    with Recorder() as rec:
        model(graph, x, edge_data)
    lines = ["chunked streaming (memory budget):"]
    staging = rec.notes.get("staging", [])
    for i, choice in enumerate(rec.notes.get("grid", [])):
        lines.append(f"  layer {i}: " + choice.describe().replace("\n", "\n  "))
        lines.append(f"    {staging[i]}")
    if len(lines) == 1:
        lines.append("  every layer runs on the 1 x 1 grid")
    return "\n".join(lines)


@torch.no_grad()
def evaluate(model: torch.nn.Module, graph: Any, x: torch.Tensor, edge_data: Any,
             y: torch.Tensor, masks: dict[str, torch.Tensor]) -> dict[str, float]:
    """Accuracy of ``model`` on each mask (eval mode)."""
    model.eval()
    pred = model(graph, x, edge_data).argmax(-1)
    return {k: float((pred[m] == y[m]).float().mean()) if m.any() else float("nan")
            for k, m in masks.items()}


class Session:
    """What the training loop runs on: one process's whole dataset and model.

    :class:`ngra.distributed.trainer.RankSession` is one rank's share of a partitioned
    run: its loss and accuracies are reduced over the ranks, and only rank 0 writes.

    Attributes:
        model: the model (evaluation, checkpoints); net: what a training step calls
            (the model, or its DistributedDataParallel wrapper).
        graph, x, edge_data, y, masks: the data (``masks``: ``train``/``val``/``test``).
        budget: ``--memory-budget`` (every forward runs under it), or ``None``.
        is_main: this process writes files, shows progress and echoes.
    """

    is_main = True

    def __init__(self, model: torch.nn.Module, graph: Any, x: torch.Tensor, edge_data: Any,
                 y: torch.Tensor, masks: dict[str, torch.Tensor], budget: str | None,
                 num_nodes: int, num_edges: int, device: torch.device | None = None,
                 placement: Placement | None = None, info: dict[str, Any] | None = None) -> None:
        self.model = self.net = model
        self.graph, self.x, self.edge_data, self.y, self.masks = graph, x, edge_data, y, masks
        self.budget, self.num_nodes, self.num_edges = budget, num_nodes, num_edges
        self.device = device if device is not None else torch.device("cpu")
        self.placement = placement
        self.info = dict(info or {})  # dataset figures for the summary

    def context(self) -> Any:
        """Around every forward: the placement on a GPU, else the memory budget."""
        if self.device.type == "cuda" and self.placement is not None:
            return placed(self.placement)
        return memory_budget(self.budget) if self.budget else contextlib.nullcontext()

    def loss(self, out: torch.Tensor) -> tuple[torch.Tensor, float]:
        """``(loss to differentiate, the loss's value)`` of the training rows."""
        m = self.masks["train"]
        loss = F.cross_entropy(out[m], self.y[m])
        return loss, float(loss.detach())

    def evaluate(self) -> dict[str, float]:
        with self.context():
            return evaluate(self.model, self.graph, self.x, self.edge_data, self.y, self.masks)

    def explain(self) -> str:
        from ngra.runtime.explain import explain

        streamed = self.placement is not None and not self.placement.resident
        with self.context():
            plans = explain(self.model, self.graph, self.x, self.edge_data)
            if self.budget or streamed:
                plans += "\n" + grid_report(self.model, self.graph, self.x, self.edge_data)
        if self.placement is not None:
            plans += f"\nplacement: {self.placement.describe()}"
        return plans

    def extra(self, times: list[float]) -> dict[str, Any]:
        """More fields for the JSON summary."""
        out: dict[str, Any] = {"device": str(self.device), **self.info}
        if self.placement is not None:
            out["placement"] = self.placement.describe()
        if self.device.type == "cuda":
            out["peak_device_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        return out

    def step_done(self) -> None:
        """After each training step (the GPU session waits for the device; the
        distributed one counts its traffic)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def fit(cfg: TrainConfig, s: Session, echo: Callable[[str], None] | None = None
        ) -> dict[str, Any]:
    """The training loop over ``s``: epochs, model selection, checkpoints, the summary."""
    resolved = cfg.resolved()
    model = s.model
    opt = torch.optim.Adam(model.parameters(), lr=resolved["lr"],
                           weight_decay=resolved["weight_decay"])
    plans = None
    if cfg.explain:
        plans = s.explain()
        if s.is_main:
            (echo or log.info)(plans)

    start, best, times, history = 0, {"val": -1.0, "test": float("nan"), "epoch": -1, "state": None}, [], []
    ckpt_path = Path(cfg.checkpoint) / CKPT_NAME if cfg.checkpoint else None
    if cfg.resume:
        if ckpt_path is None or not ckpt_path.exists():
            raise FileNotFoundError(f"--resume needs a checkpoint; none at {ckpt_path}.")
        ck = torch.load(ckpt_path, weights_only=False)
        if ck["config"]["model"] != cfg.model or ck["config"]["dataset"] != cfg.dataset:
            raise ValueError(f"checkpoint at {ckpt_path} is for {ck['config']['model']} on "
                             f"{ck['config']['dataset']}, not {cfg.model} on {cfg.dataset}.")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start, best, times, history = ck["epoch"], ck["best"], ck["times"], ck["history"]
        _set_rng_state(ck["rng"])
        log.info("resumed from %s at epoch %d", ckpt_path, start)

    bar = tqdm(range(start, cfg.epochs), desc=f"train {cfg.model}/{cfg.dataset}",
               disable=not (cfg.progress and s.is_main), initial=start, total=cfg.epochs)
    for epoch in bar:
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad()
        with s.context():
            out = s.net(s.graph, s.x, s.edge_data)
            loss, loss_value = s.loss(out)
            loss.backward()
        opt.step()
        s.step_done()
        times.append(time.perf_counter() - t0)
        acc = s.evaluate()
        history.append({"epoch": epoch + 1, "loss": loss_value, **acc})
        if acc["val"] > best["val"]:
            best = {"val": acc["val"], "test": acc["test"], "epoch": epoch + 1,
                    "state": {k: v.clone() for k, v in model.state_dict().items()}}
        bar.set_postfix(loss=f"{loss_value:.3f}", val=f"{acc['val']:.3f}", best=f"{best['val']:.3f}")
        if ckpt_path and s.is_main and ((epoch + 1) % cfg.checkpoint_every == 0
                                        or epoch + 1 == cfg.epochs):
            _save_atomic({"config": resolved, "epoch": epoch + 1, "model": model.state_dict(),
                          "optimizer": opt.state_dict(), "best": best, "times": times,
                          "history": history, "rng": _rng_state()}, ckpt_path)

    summary = {
        "model": cfg.model,
        "dataset": cfg.dataset,
        "test_acc": best["test"],
        "val_acc": best["val"],
        "best_epoch": best["epoch"],
        "epochs": cfg.epochs,
        "final_loss": history[-1]["loss"] if history else float("nan"),
        "epoch_time_s": statistics.median(times) if times else float("nan"),
        "peak_rss_mb": _peak_rss_mb(),
        "num_nodes": s.num_nodes,
        "num_edges": s.num_edges,
        "config": resolved,
        "config_sources": {k: h.source for k, h in cfg.hyper_parameters().items() if h},
        "history": history,
    }
    summary.update(s.extra(times))
    if plans is not None:
        summary["explain"] = plans
    if cfg.out and s.is_main:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(summary, indent=2) + "\n")
    return summary
