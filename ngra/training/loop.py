"""The training loop: one process's or one rank's, epochs, model selection, checkpoints,
early stop, several seeds.

:func:`fit` runs the loop over a :class:`Session`: the data and model it trains, how a
loss and accuracies are computed (and, on ranks of a partitioned run, reduced), and
whether this process writes files and shows progress. :func:`ngra.training.run.train` makes a
one-process session; :mod:`ngra.training.ranks` makes one per rank
(``RankSession``). A checkpoint holds the same state either way, so a run resumes on any
number of processes.

:func:`fit_runs` trains ``cfg.runs`` seeds (``seed .. seed + runs - 1``), each on a fresh
session, and reports the mean and sample standard deviation of their accuracies, as papers
report them; each seed checkpoints in ``DIR/seed-<seed>/``. ``patience`` stops a run early
by the GAT paper's rule (:class:`EarlyStop`: validation loss and accuracy both without
improvement for that many epochs; ``epochs`` is then the ceiling). On ranks the decision
is taken from the validation loss and accuracy reduced over every rank, so all ranks stop
at the same epoch.

The model leaves :func:`fit` holding the selected weights (the epoch with the best
validation accuracy); a checkpoint keeps them as ``model`` and the last epoch's as
``last``. Accuracies are exact fractions (correct / count), as the ranks compute them.
Checkpoints are written every ``checkpoint_every`` epochs through
:mod:`ngra.training.checkpoint` (atomic, the previous one kept, verified on read, weights
only); ``resume=True`` restores the last weights,
optimizer, best state, the early-stop state and every RNG, so a resumed run is
bit-identical to an uninterrupted one. Each step is checked for a non-finite loss,
output, gradient or weight (:func:`check_finite`), which stops the run with a
:class:`~ngra.errors.TrainingDivergedError` before the optimizer spreads it.

A device-resident run on a CUDA device (``cuda_graphs`` ``auto`` or ``on``) trains with a
capturable Adam and a step that reads nothing on the host: the loss over the training
rows by index (the mask's rows found once) and the finiteness of the loss, the outputs,
the gradients and the weights as device flags. After its warm-up the step replays from a
CUDA graph (:class:`ngra.runtime.cuda_graph.GraphedStep`), where safe; the summary's
``cuda_graph`` says ``"captured"`` or why not. The host then reads the loss and the flags
once an epoch; a flag that is not set runs :func:`check_finite`, so a divergence is
named as before, though found after the optimizer step (the weights in memory then hold
the diverged update; checkpoints do not).
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ngra.errors import CheckpointError, TrainingDivergedError
from ngra.memstat import io_read_bytes, peak_rss_bytes, release_large_frees
from ngra.models import HYPER_PARAMETERS
from ngra.probes import Recorder
from ngra.runtime.budget import memory_budget
from ngra.runtime.cuda_graph import GraphedStep, capture_refusal
from ngra.runtime.explain import explain
from ngra.runtime.placement import Placement, placed
from ngra.runtime.transfer import TransferCounts, copy_bandwidth, transfer_counts
from ngra.spill import saved_on_disk
from ngra.training.checkpoint import (CHECKPOINT_NAME, FORMAT_VERSION, PREVIOUS_NAME,
                                      load_latest_checkpoint, rng_state, save_checkpoint,
                                      set_rng_state)
from ngra.training.config import TrainConfig
from ngra.training.model_source import call_model
from ngra.training.optim import Adam
from ngra.training.summary import finish_summary, summarize_runs

__all__ = ["CHECKPOINT_KEYS", "EarlyStop", "Session", "check_finite", "evaluate", "fit",
           "fit_runs", "host_context", "grid_report", "resume_from_checkpoint"]

log = logging.getLogger(__name__)

#: What a training checkpoint holds (:func:`resume_from_checkpoint` checks them all).
CHECKPOINT_KEYS = ("format", "config", "meta", "epoch", "model", "last", "optimizer", "best",
                   "times", "history", "rng", "stopped", "patience")
#: Settings a resumed run must share with its checkpoint: they fix the weights' shapes.
_RESUME_FIELDS = ("model", "dataset", "hidden", "heads", "num_layers")


def _peak_rss_mb() -> float:
    return peak_rss_bytes() / 2**20


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resume_from_checkpoint(directory: str | Path, resolved: dict[str, Any],
                           model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore ``model`` (its last epoch's weights), ``opt`` and every RNG from the newest
    intact checkpoint in ``directory`` (``checkpoint.prev.pt`` with a warning when the
    newest is damaged).

    The optimizer continues with this run's learning rate and weight decay (a warning
    says when they differ from the checkpoint's), so a diverged run can resume with a
    smaller ``--lr``. Returns the checkpoint (``epoch``, ``best``, ``times``, ``history``).

    Raises:
        FileNotFoundError: no checkpoint in ``directory``.
        CheckpointError: every checkpoint there is damaged, or it was written by a run
            with another model, dataset or layer sizes, or past ``epochs``.
    """
    ck, path = load_latest_checkpoint(directory, CHECKPOINT_KEYS[:2])
    if ck.get("format") != FORMAT_VERSION or any(k not in ck for k in CHECKPOINT_KEYS):
        raise CheckpointError(path, f"checkpoint {path} has format {ck.get('format')!r}; this "
                                    f"ngra resumes format {FORMAT_VERSION}. Start over in "
                                    "another --checkpoint folder.")
    saved = ck["config"] if isinstance(ck["config"], dict) else {}
    diff = [f"{k}={saved.get(k)!r} there, {resolved[k]!r} here" for k in _RESUME_FIELDS
            if saved.get(k) != resolved[k]]
    if diff:
        raise CheckpointError(path, f"checkpoint {path} was written by another run "
                                    f"({'; '.join(diff)}). Resume with the same settings, or "
                                    "give another --checkpoint folder.")
    if ck["epoch"] > resolved["epochs"]:
        raise CheckpointError(path, f"checkpoint {path} is at epoch {ck['epoch']}, past the "
                                    f"{resolved['epochs']} epochs asked for; ask for more.")
    try:
        model.load_state_dict(ck["last"])
        opt.load_state_dict(ck["optimizer"])
        set_rng_state(ck["rng"])
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise CheckpointError(path, f"checkpoint {path} does not fit this model "
                                    f"({str(err).splitlines()[0]}).") from None
    for key in ("lr", "weight_decay"):
        # a group without weight decay by the model's definition (GCN's later layers) keeps 0
        groups = [g for g in opt.param_groups if key == "lr" or g.get("decay", True)]
        before = {group[key] for group in groups}
        if resolved.get(key) is not None and before != {resolved[key]}:
            log.warning("resuming with %s=%g (the checkpoint's run used %s)", key, resolved[key],
                        ", ".join(f"{v:g}" for v in sorted(before)))
            for group in groups:
                group[key] = resolved[key]
    log.info("resumed from %s at epoch %d", path, ck["epoch"])
    best = dict(ck["best"])
    best["state"] = ck["model"] if best.get("epoch", -1) > 0 else None
    return {**ck, "best": best}


def check_finite(epoch: int, resolved: dict[str, Any], model: torch.nn.Module,
                 loss: torch.Tensor | None = None, out_finite: bool = True,
                 kept: str = "") -> None:
    """Stop a diverged run: raise :class:`TrainingDivergedError` if ``loss``, the model's
    outputs (``out_finite`` False: checked by the caller before it let them go), a
    gradient or a weight holds nan or inf.

    Call it after ``backward()`` (before the optimizer step, so the weights stay
    finite) and after the step. ``kept`` says which checkpoint the failed run leaves.
    """
    problem = None
    if loss is not None and not bool(torch.isfinite(loss)):
        problem = f"the loss is {float(loss.detach())}"
    elif not out_finite:
        problem = "the model's outputs are not finite"
    else:
        for name, p in model.named_parameters():
            if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                problem = f"the gradient of {name} is not finite"
                break
            if not bool(torch.isfinite(p).all()):
                problem = f"weight {name} is not finite after the optimizer step"
                break
    if problem is None:
        return
    r = resolved
    flags = ", ".join(f"--{k.replace('_', '-')} {r[k]:g}" for k in HYPER_PARAMETERS
                      if r.get(k) is not None)
    raise TrainingDivergedError(epoch, (
        f"training diverged at epoch {epoch}: {problem}. Hyper-parameters to look at: {flags} "
        f"(model {r['model']}); a smaller --lr first (e.g. {r['lr'] / 10:g}), then the scale "
        f"of the dataset's features. {kept}").rstrip())


@torch.no_grad()
def grid_report(model: torch.nn.Module, graph: Any, x: torch.Tensor, edge_data: Any) -> str:
    """The tile grid each layer call chose under the active memory budget, its predicted
    peak, and how its tiles are staged (gathered vs spanned source rows)."""
    model.eval()
    with Recorder() as rec:
        call_model(model, graph, x, edge_data)
    lines = ["chunked streaming (memory budget):"]
    staging = rec.notes.get("staging", [])
    for i, choice in enumerate(rec.notes.get("grid", [])):
        lines.append(f"  layer {i}: " + choice.describe().replace("\n", "\n  "))
        lines.append(f"    {staging[i]}")
    if len(lines) == 1:
        lines.append("  every layer runs on the 1 x 1 grid")
    return "\n".join(lines)


def evaluate(model: torch.nn.Module, graph: Any, x: torch.Tensor, edge_data: Any,
             y: torch.Tensor, masks: dict[str, torch.Tensor]) -> dict[str, float]:
    """Accuracy of ``model`` on each mask (eval mode)."""
    return _evaluate(model, graph, x, edge_data, y, masks)[0]


@torch.no_grad()
def _evaluate(model: torch.nn.Module, graph: Any, x: torch.Tensor, edge_data: Any,
              y: torch.Tensor, masks: dict[str, torch.Tensor]) -> tuple[dict[str, float], float]:
    """:func:`evaluate`'s accuracies and the loss on ``masks["val"]`` (NaN without one),
    from one eval forward."""
    model.eval()
    logits = call_model(model, graph, x, edge_data)
    pred = logits.argmax(-1)
    # exact fractions (correct / count), as the ranks of a partitioned run compute them
    acc = {k: int((pred[m] == y[m]).sum()) / int(m.sum()) if m.any() else float("nan")
           for k, m in masks.items()}
    val = masks.get("val")
    loss = (float(F.cross_entropy(logits[val], y[val])) if val is not None and val.any()
            else float("nan"))
    return acc, loss


class EarlyStop:
    """The GAT paper's early stop: training stops after ``patience`` epochs in a row in
    which neither the validation accuracy rose above its best so far nor the validation
    loss fell below its lowest. (The authors' code also counts a tie as a rise, so an
    exactly flat run never stops there; here it stops.) ``patience=None`` never stops."""

    def __init__(self, patience: int | None, state: dict | None = None) -> None:
        self.patience = patience
        self.state = dict(state) if state else {"acc": -math.inf, "loss": math.inf, "wait": 0}

    def step(self, val_acc: float, val_loss: float) -> bool:
        """Record an epoch; whether training stops after it."""
        st = self.state
        if val_acc > st["acc"] or val_loss < st["loss"]:
            st.update(acc=max(st["acc"], val_acc), loss=min(st["loss"], val_loss), wait=0)
        else:
            st["wait"] += 1
        return self.patience is not None and st["wait"] >= self.patience


def host_context(budget: str | None, mapped_x: torch.Tensor | None = None) -> Any:
    """Around a forward on the host: the memory ``budget``; with features ``mapped_x``
    read from disk (``storage="disk"``), the saved activations go to disk beside them
    (:func:`ngra.spill.saved_on_disk`) and freed vertex arrays back to the OS."""
    stack = contextlib.ExitStack()
    if budget:
        stack.enter_context(memory_budget(budget))
    if mapped_x is not None:
        release_large_frees()  # freed vertex arrays go back to the OS, as under a budget
        stack.enter_context(saved_on_disk(near=mapped_x))
    return stack


class Session:
    """What the training loop runs on: one process's whole dataset and model.

    :class:`ngra.training.ranks.RankSession` is one rank's share of a partitioned
    run: its loss and accuracies are reduced over the ranks, and only rank 0 writes.

    Attributes:
        model: the model; net: what a training step calls (the model itself here).
        graph, x, edge_data, y, masks: the data (``masks``: ``train``/``val``/``test``).
        budget: ``--memory-budget`` (every forward runs under it), or ``None``.
        is_main: this process writes files, shows progress and echoes.
    """

    is_main = True
    #: what :meth:`evaluate` measures, and more figures of its last call (none here)
    metric = "accuracy"
    last_metrics: dict[str, float] = {}

    def __init__(self, model: torch.nn.Module, graph: Any, x: torch.Tensor, edge_data: Any,
                 y: torch.Tensor, masks: dict[str, torch.Tensor], budget: str | None,
                 num_nodes: int, num_edges: int, device: torch.device | None = None,
                 placement: Placement | None = None, info: dict[str, Any] | None = None) -> None:
        self.model = self.net = self.encoder = model
        self.graph, self.x, self.edge_data, self.y, self.masks = graph, x, edge_data, y, masks
        self.budget, self.num_nodes, self.num_edges = budget, num_nodes, num_edges
        self.device = device if device is not None else torch.device("cpu")
        self.placement = placement
        self.info = dict(info or {})  # dataset figures for the summary
        self.read_start = io_read_bytes()  # disk_read_mb: what training reads (storage=disk)
        self.moved: list[TransferCounts] = []  # each streamed step's host <-> device bytes
        self._moved_from = transfer_counts().copy()
        # the training rows by index, found once: indexing by the mask would find them
        # every step (on a GPU a host wait, and no CUDA graph can hold it)
        self.train_index = masks["train"].nonzero().view(-1)
        self.train_y = y.index_select(0, self.train_index)

    def context(self) -> Any:
        """Around every forward (and a training step's backward): the placement on a GPU,
        else the memory budget; with the data on disk (``storage="disk"``) the saved
        activations go to disk too (:func:`ngra.spill.saved_on_disk`)."""
        if self.device.type == "cuda" and self.placement is not None:
            return placed(self.placement)
        return host_context(self.budget, self.x if self.info.get("storage") == "disk" else None)

    def batches(self, epoch: int) -> tuple[None]:
        """An epoch's steps: one, over the whole graph."""
        return (None,)

    def forward(self, batch: Any = None) -> torch.Tensor:
        """The model's output on the whole graph."""
        return call_model(self.net, self.graph, self.x, self.edge_data)

    def loss(self, out: torch.Tensor, batch: Any = None) -> tuple[torch.Tensor, float]:
        """``(loss to differentiate, the loss's value)`` of the training rows."""
        loss = self.train_loss(out)
        return loss, float(loss.detach())

    def train_loss(self, out: torch.Tensor) -> torch.Tensor:
        """The loss of the training rows, read nowhere (no host wait)."""
        return F.cross_entropy(out.index_select(0, self.train_index), self.train_y)

    def capture_refusal(self) -> str | None:
        """Why this session's training step cannot replay from a CUDA graph, or ``None``
        (see :func:`ngra.runtime.cuda_graph.capture_refusal`)."""
        return capture_refusal(self.device, self.placement)

    def after_backward(self) -> None:
        """After ``backward()`` (the distributed session sums the gradients over ranks)."""

    def evaluate(self) -> tuple[dict[str, float], float]:
        """``(accuracy on each mask, validation loss)`` in eval mode."""
        with self.context():
            return _evaluate(self.model, self.graph, self.x, self.edge_data, self.y, self.masks)

    def explain(self) -> str:
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
        out: dict[str, Any] = {"device": str(self.device), **self.info,
                               "disk_read_mb": (io_read_bytes() - self.read_start) / 2**20}
        if self.placement is not None:
            out["placement"] = self.placement.describe()
        if self.device.type == "cuda":
            out["peak_device_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.moved:  # streamed through the device: bytes a step and the transfer bound
            out.update(transfer_summary(self.moved, times, self.device))
        return out

    def step_begin(self) -> None:
        """Before each training step."""
        self._moved_from = transfer_counts().copy()

    def step_done(self) -> None:
        """After each training step (the GPU session waits for the device and counts the
        bytes a streamed step moved; the distributed one counts its traffic)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        moved = transfer_counts().since(self._moved_from)
        if moved.h2d_copies or moved.d2h_copies:
            self.moved.append(moved)


def transfer_summary(moved: list[TransferCounts], times: list[float],
                     device: torch.device) -> dict[str, Any]:
    """JSON fields of a run streamed through ``device``: the median training step's bytes
    each way, the transfer bound (those bytes at the device's pinned copy bandwidth,
    :func:`ngra.runtime.transfer.copy_bandwidth`) and the median step over it."""
    epoch = TransferCounts.median(moved)
    bw = copy_bandwidth(device)
    bound = bw.seconds(epoch)
    step = statistics.median(times[-len(moved):]) if times else float("nan")
    return {"h2d_mb_per_epoch": epoch.h2d_bytes / 2**20,
            "d2h_mb_per_epoch": epoch.d2h_bytes / 2**20,
            "copy_bandwidth_gbs": {"h2d": bw.h2d / 1e9, "d2h": bw.d2h / 1e9},
            "transfer_bound_s": bound,
            "epoch_over_transfer_bound": step / bound if bound > 0 else float("nan")}


def fit_runs(cfg: TrainConfig, make_session: Callable[[int], Session],
             echo: Callable[[str], None] | None = None, *,
             meta: dict[str, Any] | None = None) -> tuple[dict[str, Any], torch.nn.Module]:
    """Train ``cfg.runs`` seeds, ``seed .. seed + runs - 1``: torch, numpy and Python seeded
    with each, then ``make_session(seed)`` builds that run's model and session and
    :func:`fit` trains it. Returns the summary (
    :mod:`ngra.training.summary`: with several runs, every run's under ``results`` and the
    mean and sample standard deviation of their accuracies, epochs and best epochs) and
    the model with the selected weights of the run with the best validation accuracy.
    Each of several runs checkpoints in ``DIR/seed-<seed>/``; ``meta`` goes into every
    checkpoint (what rebuilds the model)."""
    results, s, best_model, best_val = [], None, None, -math.inf
    for i in range(cfg.runs):
        seed = cfg.seed + i
        several = cfg.runs > 1
        folder = (str(Path(cfg.checkpoint) / f"seed-{seed}") if several and cfg.checkpoint
                  else cfg.checkpoint)
        _seed_all(seed)
        s = make_session(seed)
        results.append(fit(cfg, s, echo if i == 0 else None, seed=seed, checkpoint=folder,
                           run=(i, cfg.runs) if several else None, meta=meta))
        if best_model is None or results[-1]["val_acc"] > best_val:
            best_model, best_val = s.model, results[-1]["val_acc"]
    summary = (finish_summary(results[0]) if cfg.runs == 1
               else summarize_runs(cfg.model_name, cfg.dataset_name, results, cfg.extra))
    return summary, best_model


def fit(cfg: TrainConfig, s: Session, echo: Callable[[str], None] | None = None,
        seed: int | None = None, checkpoint: str | None = None,
        run: tuple[int, int] | None = None, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The training loop over ``s``: epochs, model selection, early stop, checkpoints (in
    ``checkpoint``, default ``cfg.checkpoint``, with ``meta``), the summary. ``seed``: the
    run's (default ``cfg.seed``); ``run``: ``(index, count)`` of a run among several
    (:func:`fit_runs`), which resumes only if its folder holds a checkpoint (a run not yet
    begun starts anew). The model ends holding the selected weights (best validation
    accuracy)."""
    resolved = cfg.resolved()
    seed = cfg.seed if seed is None else seed
    checkpoint = cfg.checkpoint if checkpoint is None else checkpoint
    model = s.model
    graphed = _graphed(cfg, s)
    if cfg.optimizer is not None:
        opt = cfg.optimizer(model)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer(model) must return a torch.optim.Optimizer; got "
                            f"{type(opt).__name__}.")
    else:
        # capturable: Adam keeps its step count on the device, so its step needs no host read;
        # ngra's Adam is torch's without importing torch._dynamo (146 MB a process)
        opt = Adam(_param_groups(cfg, s, resolved["weight_decay"]),
                               lr=resolved["lr"], capturable=graphed is not None)
    plans = None
    if cfg.explain and (run is None or run[0] == 0):
        plans = s.explain()
        if s.is_main:
            (echo or log.info)(plans)

    best = {"val": -1.0, "test": float("nan"), "epoch": -1, "state": None}
    start, times, history = 0, [], []
    stopped, patience = False, EarlyStop(cfg.patience)
    resume = cfg.resume and (run is None or _has_checkpoint(checkpoint))
    if resume:
        ck = resume_from_checkpoint(checkpoint, resolved, model, opt)
        if hasattr(s, "restore_state"):  # a rank's own state (stale halos)
            s.restore_state(ck)
        start, best, times, history = ck["epoch"], ck["best"], ck["times"], ck["history"]
        stopped = ck.get("stopped", False)
        patience = EarlyStop(cfg.patience, ck.get("patience"))
    kept = (f"The checkpoint in {checkpoint} (epoch {start}) is kept." if resume else
            "No checkpoint was saved before it." if checkpoint else
            "No checkpoint is kept (no --checkpoint folder was given).")

    label = f"train {cfg.model_name}/{cfg.dataset_name}" + ("" if run is None else
                                                  f" seed {seed} ({run[0] + 1}/{run[1]})")
    bar = tqdm(range(start, cfg.epochs), desc=label,
               disable=not (cfg.progress and s.is_main) or stopped, initial=start,
               total=cfg.epochs)
    step = None if graphed is None else graphed(_device_step(s, opt), s.device)
    for epoch in bar:
        if stopped:
            break
        t0 = time.perf_counter()
        s.step_begin()
        model.train()
        if step is not None:
            loss_value = _read_device_step(step(), epoch + 1, resolved, model, kept)
        else:
            values = []
            for batch in s.batches(epoch):  # one full-graph step, or a graph task's batches
                opt.zero_grad()
                with s.context():
                    out = s.forward(batch)
                    loss, value = s.loss(out, batch)
                    # the outputs are checked now and let go: an N x classes array not held
                    # through backward (R-MAT 2^23, 8 classes: 268 MB off the peak)
                    out_finite = bool(torch.isfinite(out.detach()).all())
                    del out
                    loss.backward()
                s.after_backward()
                check_finite(epoch + 1, resolved, model, loss, out_finite=out_finite,
                             kept=kept)
                opt.step()
                check_finite(epoch + 1, resolved, model, kept=kept)
                values.append(value)
            loss_value = statistics.fmean(values) if values else float("nan")
        s.step_done()
        times.append(time.perf_counter() - t0)
        acc, val_loss = s.evaluate()
        history.append({"epoch": epoch + 1, "loss": loss_value, **acc, "val_loss": val_loss})
        if acc["val"] > best["val"]:
            best = {"val": acc["val"], "test": acc["test"], "epoch": epoch + 1,
                    "metrics": dict(s.last_metrics),
                    "state": {k: v.clone() for k, v in model.state_dict().items()}}
        # the same on every rank: the accuracies and the loss are reduced over the ranks
        stopped = patience.step(acc["val"], val_loss)
        bar.set_postfix(loss=f"{loss_value:.3f}", val=f"{acc['val']:.3f}",
                        best=f"{best['val']:.3f}")
        if checkpoint and ((epoch + 1) % cfg.checkpoint_every == 0 or epoch + 1 == cfg.epochs
                           or stopped):
            path = Path(checkpoint)
            # a rank's own state (stale halos), gathered to the writer: every rank calls it
            own = s.checkpoint_state() if hasattr(s, "checkpoint_state") else {}
            if s.is_main:  # ranks hold the same state: one writes it
                last = model.state_dict()
                path = save_checkpoint({
                    "format": FORMAT_VERSION, "config": resolved, "meta": meta or {},
                    "epoch": epoch + 1,
                    "model": best["state"] if best["state"] is not None else last,
                    "last": last, "optimizer": opt.state_dict(),
                    "best": {k: v for k, v in best.items() if k != "state"},
                    "times": times, "history": history, "rng": rng_state(),
                    "stopped": stopped, "patience": patience.state, **own}, checkpoint)
            kept = (f"The last checkpoint, {path} (epoch {epoch + 1}; best val_acc "
                    f"{best['val']:.4f} at epoch {best['epoch']}), is kept.")
    if stopped:
        log.info("early stop after epoch %d: validation loss and accuracy did not improve "
                 "for %d epochs", len(history), cfg.patience)

    if best["state"] is not None:  # the model leaves holding the selected weights
        model.load_state_dict(best["state"])
    summary = {
        "model": cfg.model_name,
        "dataset": cfg.dataset_name,
        "seed": seed,
        "task": cfg.task,
        "metric": s.metric,
        "metrics": best.get("metrics") or None,
        "test_acc": best["test"],
        "val_acc": best["val"],
        "best_epoch": best["epoch"],
        "epochs": len(history),
        "stopped_early": stopped,
        "final_loss": history[-1]["loss"] if history else float("nan"),
        "epoch_time_s": statistics.median(times) if times else float("nan"),
        "peak_rss_mb": _peak_rss_mb(),
        "num_nodes": s.num_nodes,
        "num_edges": s.num_edges,
        "config": resolved,
        "config_sources": {k: h.source for k, h in cfg.hyper_parameters().items() if h},
        "history": history,
    }
    summary["cuda_graph"] = (step.describe() if step is not None else
                             "off (--cuda-graphs off)" if cfg.cuda_graphs == "off" else
                             _static_refusal(s))
    summary.update(s.extra(times))
    summary.update(cfg.extra)
    if plans is not None:
        summary["explain"] = plans
    return summary


def _param_groups(cfg: TrainConfig, s: Session, weight_decay: float) -> list[dict[str, Any]]:
    """The optimizer's groups: the model's own (GCN decays its first layer only) over the
    session's encoder, and a task's decoder or head with ``weight_decay``."""
    groups = cfg.source.param_groups(s.encoder, weight_decay)
    mine = {id(p) for g in groups for p in g["params"]}
    rest = [p for p in s.model.parameters() if p.requires_grad and id(p) not in mine]
    return groups + ([{"params": rest, "weight_decay": weight_decay}] if rest else [])


def _static_refusal(s: Session) -> str:
    """Why ``s``'s step is never captured, known before training."""
    if not isinstance(s, Session):
        return ("a distributed rank: its gradients are all-reduced between backward and the "
                "optimizer step")
    return s.capture_refusal() or "not captured"


def _graphed(cfg: TrainConfig, s: Session) -> Callable[..., GraphedStep] | None:
    """How ``s``'s steps are made into a :class:`GraphedStep` (``None``: the host-checked
    eager loop, where no graph can be captured or ``cuda_graphs`` is off).
    ``cuda_graphs="on"`` raises where a graph cannot be."""
    if cfg.cuda_graphs == "off":
        return None
    why = (_static_refusal(s) if not isinstance(s, Session) else
           "a user-given optimizer (it may read the host)" if cfg.optimizer is not None
           else s.capture_refusal())
    if why is not None:
        if cfg.cuda_graphs == "on":
            raise ValueError(f"--cuda-graphs on: this run's training step cannot be "
                             f"captured: {why}. Use --cuda-graphs auto (or off).")
        if isinstance(s, Session) and s.device.type == "cuda":
            log.info("training step runs eagerly, not from a CUDA graph: %s", why)
        return None

    def make(step: Callable[[], torch.Tensor], device: torch.device) -> GraphedStep:
        return GraphedStep(step, device, strict=cfg.cuda_graphs == "on")

    return make


def _device_step(s: Session, opt: torch.optim.Optimizer) -> Callable[[], torch.Tensor]:
    """One training step that reads nothing on the host: it returns ``[5]`` in the loss's
    dtype, the loss and four finiteness flags (loss, outputs, gradients, weights; 1 or 0),
    for :func:`_read_device_step`. The gradients' and weights' flags screen their norms
    (one batched kernel each): a norm may overflow where every entry is finite, and the
    reader then checks entry by entry."""
    params = [p for p in s.model.parameters() if p.requires_grad]

    def finite_norms(ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.isfinite(torch.stack(torch._foreach_norm(ts))).all()

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with s.context():
            out = call_model(s.net, s.graph, s.x, s.edge_data)
            loss = s.train_loss(out)
            out_ok = torch.isfinite(out.detach()).all()
            del out
            loss.backward()
        grads = [p.grad for p in params if p.grad is not None]
        grads_ok = finite_norms(grads) if grads else out_ok.new_ones(())
        opt.step()
        loss = loss.detach()
        flags = torch.stack([torch.isfinite(loss), out_ok, grads_ok, finite_norms(params)])
        return torch.cat([loss.view(1), flags.to(loss.dtype)])

    return step


def _read_device_step(result: torch.Tensor, epoch: int, resolved: dict[str, Any],
                      model: torch.nn.Module, kept: str) -> float:
    """The loss of a :func:`_device_step` result (one host read); raises
    :class:`TrainingDivergedError` through :func:`check_finite` when a flag is not set."""
    loss, *flags = result.tolist()
    if not all(flags):
        check_finite(epoch, resolved, model, result[0], out_finite=bool(flags[1]), kept=kept)
        check_finite(epoch, resolved, model, kept=kept)
    return loss


def _has_checkpoint(directory: str | None) -> bool:
    return directory is not None and any(
        (Path(directory) / name).exists() for name in (CHECKPOINT_NAME, PREVIOUS_NAME))
