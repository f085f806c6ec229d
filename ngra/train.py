"""Full-graph node-classification training with model selection and checkpoints.

``train(TrainConfig(...))`` loads the dataset, builds the zoo model, trains
full-graph for ``epochs`` epochs (tqdm progress), keeps the weights with the
best validation accuracy, and returns (and optionally writes as JSON) a summary
with ``test_acc``, ``val_acc``, ``epochs``, ``epoch_time_s`` (median),
``peak_rss_mb`` and the resolved ``config``.

Checkpoints are written every ``checkpoint_every`` epochs through
:mod:`ngra.checkpoint` (atomic, the previous one kept, verified on read);
``resume=True`` restores model, optimizer, best state and every RNG, so a resumed
run is bit-identical to an uninterrupted one.

Nothing runs on meaningless input: before training the dataset is checked
(:func:`ngra.datasets.check_trainable`, :func:`check_predictions_vary`), and each
step is checked for a non-finite loss, output, gradient or weight
(:func:`check_finite`), which stops the run with a
:class:`~ngra.errors.TrainingDivergedError` before the optimizer spreads it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ngra.checkpoint import load_latest_checkpoint, save_checkpoint
from ngra.errors import CheckpointError, DatasetError, TrainingDivergedError
from ngra.memstat import peak_rss_bytes
from ngra.models import HYPER_PARAMETERS, MODELS, build_model, hyper_parameters, prepare
from ngra.runtime.budget import memory_budget
from ngra.runtime.placement import (Placement, move_to, placed, plan_placement, resident_bytes,
                                    resolve_device)

__all__ = ["TrainConfig", "train", "evaluate", "reorder_dataset", "grid_report", "describe_run",
           "check_finite", "check_predictions_vary", "check_run_files", "resume_from_checkpoint"]

log = logging.getLogger(__name__)

#: What a training checkpoint holds (:func:`resume_from_checkpoint` checks them all).
CHECKPOINT_KEYS = ("config", "epoch", "model", "optimizer", "best", "times", "history", "rng")
#: Settings a resumed run must share with its checkpoint: they fix the weights' shapes.
_RESUME_FIELDS = ("model", "dataset", "hidden", "heads", "num_layers")


@dataclass
class TrainConfig:
    """One training run. Every CLI flag of ``ngra train`` maps to one field.

    ``None`` hyper-parameters take the model's defaults (``ngra.models.MODELS``, sources in
    :func:`ngra.models.defaults_table`); a value for a setting the model has not (``heads``
    for GCN) or out of range (``hidden=0``) is refused by :meth:`resolved`.
    """

    model: str = "gcn"
    dataset: str = "sbm"
    epochs: int = 200
    seed: int = 0
    hidden: int | None = None
    heads: int | None = None
    num_layers: int = 2
    lr: float | None = None
    weight_decay: float | None = None
    dropout: float | None = None
    data_root: str | None = None
    out: str | None = None
    checkpoint: str | None = None
    checkpoint_every: int = 10
    resume: bool = False
    threads: int | None = None
    progress: bool = True
    explain: bool = False
    memory_budget: str | None = None
    reorder: str = "none"
    device: str = "cpu"
    extra: dict = field(default_factory=dict)

    def hyper_parameters(self) -> dict[str, Any]:
        """``{name: Hyper(value, source) or None}`` (see :func:`ngra.models.hyper_parameters`)."""
        return hyper_parameters(self.model, **{k: getattr(self, k) for k in HYPER_PARAMETERS})

    def resolved(self) -> dict[str, Any]:
        """Every field, hyper-parameters filled in from the model's defaults."""
        d = asdict(self)
        d.update({k: h and h.value for k, h in self.hyper_parameters().items()})
        return d


def describe_run(cfg: TrainConfig) -> str:
    """The hyper-parameters a run uses and where each comes from (printed at its start)."""
    hp = {k: h for k, h in cfg.hyper_parameters().items() if h is not None}
    given = [k for k, h in hp.items() if h.source == "given"]
    sources = sorted({h.source for h in hp.values() if h.source != "given"})
    values = " ".join(f"{k}={h.value:g}" for k, h in hp.items())
    lines = [f"ngra train {cfg.model} on {cfg.dataset}: {values} num_layers={cfg.num_layers} "
             f"epochs={cfg.epochs} seed={cfg.seed}"]
    if given:
        lines.append(f"  given: {', '.join(given)}")
    lines += [f"  model default: {', '.join(k for k, h in hp.items() if h.source == src)} "
              f"from {src}" for src in sources]
    return "\n".join(lines)


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


def resume_from_checkpoint(directory: str | Path, resolved: dict[str, Any],
                           model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore ``model``, ``opt`` and every RNG from the newest intact checkpoint in
    ``directory`` (``checkpoint.prev.pt`` with a warning when the newest is damaged).

    The optimizer continues with this run's learning rate and weight decay (a warning
    says when they differ from the checkpoint's), so a diverged run can resume with a
    smaller ``--lr``. Returns the checkpoint (``epoch``, ``best``, ``times``, ``history``).

    Raises:
        FileNotFoundError: no checkpoint in ``directory``.
        CheckpointError: every checkpoint there is damaged, or it was written by a run
            with another model, dataset or layer sizes, or past ``epochs``.
    """
    ck, path = load_latest_checkpoint(directory, CHECKPOINT_KEYS)
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
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        _set_rng_state(ck["rng"])
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise CheckpointError(path, f"checkpoint {path} does not fit this model "
                                    f"({str(err).splitlines()[0]}).") from None
    for key in ("lr", "weight_decay"):
        before = {group[key] for group in opt.param_groups}
        if before != {resolved[key]}:
            log.warning("resuming with %s=%g (the checkpoint's run used %s)", key, resolved[key],
                        ", ".join(f"{v:g}" for v in sorted(before)))
        for group in opt.param_groups:
            group[key] = resolved[key]
    log.info("resumed from %s at epoch %d", path, ck["epoch"])
    return ck


def check_run_files(cfg: TrainConfig) -> None:
    """Fail before training, not after it, on checkpoint and output settings that cannot work."""
    if cfg.checkpoint_every < 1:
        raise ValueError(f"--checkpoint-every must be >= 1 (epochs); got {cfg.checkpoint_every}.")
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"--threads must be >= 1; got {cfg.threads}.")
    if cfg.resume and not cfg.checkpoint:
        raise ValueError("--resume needs --checkpoint DIR (the folder the run saved to).")
    if cfg.checkpoint and Path(cfg.checkpoint).exists() and not Path(cfg.checkpoint).is_dir():
        raise ValueError(f"--checkpoint {cfg.checkpoint} is a file; it must name a folder.")
    if cfg.out and Path(cfg.out).is_dir():
        raise ValueError(f"--out {cfg.out} is a folder; it must name the JSON file to write.")
    for folder in (Path(cfg.out).parent if cfg.out else None, cfg.checkpoint):
        if folder is None:
            continue
        Path(folder).mkdir(parents=True, exist_ok=True)  # raises a clear OSError if it cannot
        if not os.access(folder, os.W_OK):
            raise PermissionError(f"cannot write to {folder} (--out / --checkpoint).")


@torch.no_grad()
def check_predictions_vary(model: torch.nn.Module, graph: Any, x: torch.Tensor, edge_data: Any,
                           model_name: str, dataset: str) -> None:
    """On a graph with no edges, fail if the model predicts the same for every vertex.

    A model that reads a vertex only through its in-edges (G-GCN) sees nothing there;
    models that also read the vertex's own features train as MLPs and pass.
    """
    if graph.num_edges or graph.num_nodes < 2:
        return
    model.eval()
    out = model(graph, x, edge_data)
    if bool((out == out[:1]).all()):
        raise DatasetError(
            f"{dataset} has no edges, and {model_name} reads a vertex only through its "
            "in-edges: it would predict the same class for every vertex. Use a model that "
            "also reads the vertex's own features (gcn, sage, gat, gin), or a graph with edges."
        )


def check_finite(epoch: int, resolved: dict[str, Any], model: torch.nn.Module,
                 loss: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 kept: str = "") -> None:
    """Stop a diverged run: raise :class:`TrainingDivergedError` if ``loss``, the model's
    outputs ``out``, a gradient or a weight holds nan or inf.

    Call it after ``backward()`` (before the optimizer step, so the weights stay
    finite) and after the step. ``kept`` says which checkpoint the failed run leaves.
    """
    problem = None
    if loss is not None and not bool(torch.isfinite(loss)):
        problem = f"the loss is {float(loss.detach())}"
    elif out is not None and not bool(torch.isfinite(out).all()):
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


def _placement(device: torch.device, cfg: TrainConfig, graph: Any, x: torch.Tensor,
               model: torch.nn.Module, extra: list[Any]) -> Placement:
    """Where this run trains (see :mod:`ngra.runtime.placement`)."""
    from ngra.partition import parse_bytes

    budget = parse_bytes(cfg.memory_budget) if cfg.memory_budget else None
    more = sum(t.numel() * t.element_size() for t in _tensors(extra))
    return plan_placement(device, resident_bytes(graph, x, model, more), budget=budget)


def _tensors(items: list[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for it in items:
        if isinstance(it, torch.Tensor):
            out.append(it)
        elif isinstance(it, dict):
            out += [v for v in it.values() if isinstance(v, torch.Tensor)]
    return out


@torch.no_grad()
def evaluate(model: torch.nn.Module, graph: Any, x: torch.Tensor, edge_data: Any,
             y: torch.Tensor, masks: dict[str, torch.Tensor]) -> dict[str, float]:
    """Accuracy of ``model`` on each mask (eval mode)."""
    model.eval()
    pred = model(graph, x, edge_data).argmax(-1)
    return {k: float((pred[m] == y[m]).float().mean()) if m.any() else float("nan")
            for k, m in masks.items()}


def train(cfg: TrainConfig, echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train per ``cfg``; returns the JSON summary (also written to ``cfg.out``).

    With ``cfg.explain`` the compiled plan of every layer is put in the summary
    (``"explain"``) and handed to ``echo`` (default: logged at INFO) before training.
    """
    from ngra.datasets import check_trainable, load

    if cfg.model not in MODELS:
        raise ValueError(f"unknown model {cfg.model!r}; choose one of {sorted(MODELS)}.")
    if cfg.epochs < 1:
        raise ValueError(f"epochs must be >= 1; got {cfg.epochs}.")
    check_run_files(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    resolved = cfg.resolved()
    log.info("ngra train config: %s", json.dumps(resolved, sort_keys=True))
    (echo or log.info)(describe_run(cfg))

    ds = load(cfg.dataset, root=cfg.data_root)
    check_trainable(ds, cfg.dataset)
    if cfg.reorder != "none":
        ds = reorder_dataset(ds, cfg.reorder, seed=cfg.seed)
    _seed_all(cfg.seed)
    graph, edge_data = prepare(cfg.model, ds.graph, ds.edge_type, ds.num_edge_types)
    model = build_model(cfg.model, ds.x.shape[1], ds.num_classes, hidden=resolved["hidden"],
                        heads=resolved["heads"], num_layers=cfg.num_layers,
                        num_edge_types=ds.num_edge_types, dropout=resolved["dropout"])
    masks = {"train": ds.train_mask, "val": ds.val_mask, "test": ds.test_mask}
    x, y = ds.x, ds.y
    placement = _placement(device, cfg, graph, x, model, [y, edge_data, *masks.values()])
    log.info("placement: %s", placement.describe())
    if device.type == "cuda" and placement.resident:
        graph, x, y, edge_data, model = move_to(device, graph, x, y, edge_data, model)
        masks = dict(zip(masks, move_to(device, *masks.values())))
    opt = torch.optim.Adam(model.parameters(), lr=resolved["lr"],
                           weight_decay=resolved["weight_decay"])
    check_predictions_vary(model, graph, x, edge_data, cfg.model, cfg.dataset)

    def budget_ctx() -> Any:
        if device.type == "cuda":
            return placed(placement)
        return memory_budget(cfg.memory_budget) if cfg.memory_budget else contextlib.nullcontext()

    plans = None
    if cfg.explain:
        from ngra.runtime.explain import explain

        with budget_ctx():
            plans = explain(model, graph, x, edge_data)
            if cfg.memory_budget or not placement.resident:
                plans += "\n" + grid_report(model, graph, x, edge_data)
            plans += f"\nplacement: {placement.describe()}"
        (echo or log.info)(plans)

    start, best, times, history = 0, {"val": -1.0, "test": float("nan"), "epoch": -1, "state": None}, [], []
    if cfg.resume:
        ck = resume_from_checkpoint(cfg.checkpoint, resolved, model, opt)
        start, best, times, history = ck["epoch"], ck["best"], ck["times"], ck["history"]
    kept = (f"The checkpoint in {cfg.checkpoint} (epoch {start}) is kept." if cfg.resume else
            "No checkpoint was saved before it." if cfg.checkpoint else
            "No checkpoint is kept (no --checkpoint folder was given).")

    bar = tqdm(range(start, cfg.epochs), desc=f"train {cfg.model}/{cfg.dataset}",
               disable=not cfg.progress, initial=start, total=cfg.epochs)
    for epoch in bar:
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad()
        with budget_ctx():
            out = model(graph, x, edge_data)
            loss = F.cross_entropy(out[masks["train"]], y[masks["train"]])
            loss.backward()
        check_finite(epoch + 1, resolved, model, loss, out.detach(), kept)
        opt.step()
        check_finite(epoch + 1, resolved, model, kept=kept)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        with budget_ctx():
            acc = evaluate(model, graph, x, edge_data, y, masks)
        history.append({"epoch": epoch + 1, "loss": float(loss.detach()), **acc})
        if acc["val"] > best["val"]:
            best = {"val": acc["val"], "test": acc["test"], "epoch": epoch + 1,
                    "state": {k: v.clone() for k, v in model.state_dict().items()}}
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", val=f"{acc['val']:.3f}", best=f"{best['val']:.3f}")
        if cfg.checkpoint and ((epoch + 1) % cfg.checkpoint_every == 0 or epoch + 1 == cfg.epochs):
            path = save_checkpoint({"config": resolved, "epoch": epoch + 1,
                                    "model": model.state_dict(), "optimizer": opt.state_dict(),
                                    "best": best, "times": times, "history": history,
                                    "rng": _rng_state()}, cfg.checkpoint)
            kept = (f"The last checkpoint, {path} (epoch {epoch + 1}; best val_acc "
                    f"{best['val']:.4f} at epoch {best['epoch']}), is kept.")

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
        "device": str(device),
        "placement": placement.describe(),
        "num_nodes": ds.graph.num_nodes,
        "num_edges": ds.graph.num_edges,
        "reciprocity": ds.reciprocity,
        "dataset_summary": ds.summary(),
        "config": resolved,
        "config_sources": {k: h.source for k, h in cfg.hyper_parameters().items() if h},
        "history": history,
    }
    if device.type == "cuda":
        summary["peak_device_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    if plans is not None:
        summary["explain"] = plans
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(summary, indent=2) + "\n")
    return summary
