"""``ngra.fit``: train any model built from SAGA layers, on any data, with everything the
command line has (budgets, disk storage, several processes, GPU, checkpoints, early stop,
several seeds), and get a :class:`TrainResult` back.

::

    result = ngra.fit(build_model, "cora", epochs=200, patience=50, checkpoint="ckpt/")
    result.test_acc, result.history[-1]          # metrics; result.to_json(): the summary
    labels = result.predict("cora")              # per vertex; or ngra.load_model("ckpt/")

``model`` is a zoo name, ``"module:callable"``, a factory ``f(num_features, num_classes,
**hyper)`` or an ``nn.Module`` (:mod:`ngra.training.model_source`); ``data`` a spec
string, a ``NodeDataset``, a PyG ``Data``, a DGL graph or a dict of tensors
(:mod:`ngra.training.data`). With ``nprocs=K`` the factory (or module) is pickled to
``K`` processes, as torch's launchers do: a factory must be importable (defined at a
module's top level, not in ``__main__`` of an interactive session).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ngra.diskspace import write_file
from ngra.training.checkpoint import FORMAT_VERSION, save_checkpoint
from ngra.training.config import TrainConfig
from ngra.training.predict import Predictor
from ngra.training.run import run

__all__ = ["TrainResult", "fit"]


@dataclass
class TrainResult:
    """What :func:`fit` returns.

    Attributes:
        model: the trained model holding the selected weights (best validation accuracy;
            of the best run among several seeds). ``None`` only for a factory on several
            processes that cannot be rebuilt here.
        summary: the JSON summary (:mod:`ngra.training.summary`: every key always there).
        meta: what rebuilds the model (model, hyper-parameters, preparation, data).
    """

    model: nn.Module | None
    summary: dict[str, Any]
    meta: dict[str, Any]

    @property
    def history(self) -> list[dict[str, Any]]:
        """Per epoch: ``loss``, ``train``/``val``/``test`` accuracy, ``val_loss``."""
        return self.summary["history"] or []

    @property
    def test_acc(self) -> float:
        """Test accuracy at the selected epoch (the mean over several runs)."""
        return self.summary["test_acc_mean"]

    @property
    def val_acc(self) -> float:
        return self.summary["val_acc_mean"]

    @property
    def best_epoch(self) -> int | None:
        return self.summary["best_epoch"]

    @property
    def epoch_time_s(self) -> float:
        return self.summary["epoch_time_s"]

    @property
    def peak_rss_mb(self) -> float:
        return self.summary["peak_rss_mb"]

    def to_json(self, path: str | Path | None = None) -> dict[str, Any]:
        """The summary (what ``ngra train --out`` writes); also written to ``path``."""
        if path is not None:
            write_file(path, json.dumps(self.summary, indent=2) + "\n", "the run's summary")
        return self.summary

    def predictor(self) -> Predictor:
        """The model with the preparation it trained with."""
        if self.model is None:
            raise ValueError("this result holds no model (a factory trained on several "
                             "processes that cannot be rebuilt here); load its checkpoint.")
        return Predictor(self.model, self.meta)

    def predict(self, data: Any, **kwargs: Any) -> torch.Tensor:
        """:meth:`Predictor.predict` (labels by default; ``output="scores"``,
        ``embeddings="layers.0"``)."""
        return self.predictor().predict(data, **kwargs)

    def save(self, directory: str | Path) -> Path:
        """Write the model and its metadata as a checkpoint folder that
        :func:`ngra.load_model` and ``ngra predict`` read."""
        if self.model is None:
            raise ValueError("this result holds no model to save.")
        return save_checkpoint({"format": FORMAT_VERSION, "meta": self.meta,
                                "config": self.summary.get("config") or {},
                                "model": self.model.state_dict()}, directory)


_OPTIONS = {f.name for f in fields(TrainConfig)} - {"model", "dataset", "extra"}


def fit(model: Any, data: Any, *, task: str = "node", epochs: int = 200,
        optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None,
        nprocs: int = 1, memory_budget: str | None = None, storage: str = "memory",
        device: str = "cpu", checkpoint: str | None = None, patience: int | None = None,
        runs: int = 1, seed: int = 0, progress: bool = True,
        echo: Callable[[str], None] | None = None, **options: Any) -> TrainResult:
    """Train ``model`` on ``data`` full-graph (module docstring).

    Args:
        model: a zoo name, ``"module:callable"``, a factory or an ``nn.Module``.
        data: a dataset spec, ``NodeDataset``, PyG ``Data``, DGL graph or dict of tensors.
        task: ``"node"`` (node classification).
        epochs: the most epochs a run trains (``patience`` may stop it earlier).
        optimizer: ``optimizer(model) -> torch.optim.Optimizer`` (default: Adam with
            ``lr``/``weight_decay``: the zoo's paper values, else 0.01 and 5e-4).
        nprocs: processes to train on (the graph partitioned between them; ``task="graph"``:
            each batch's graphs split between them).
        memory_budget: e.g. ``"2GB"``: every layer streams in tiles within it.
        storage: ``"memory"``, ``"disk"`` (map the dataset's arrays) or ``"auto"``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        checkpoint: a folder to checkpoint into (``resume=True`` continues from it).
        patience: stop after this many epochs without a better validation loss or
            accuracy.
        runs: train seeds ``seed .. seed + runs - 1`` (needs a factory).
        progress: show a progress bar.
        echo: where the run's header goes (default: logged).
        **options: any other ``ngra train`` setting by its field name (``lr``,
            ``weight_decay``, ``hidden``, ``dropout``, ``num_layers``, ``resume``,
            ``checkpoint_every``, ``out``, ``threads``, ``reorder``, ``exchange``,
            ``partition``, ``normalize_features``, ``data_root``, ``explain``, ...).

    Raises:
        TypeError: an option that is no setting (the settings are listed).
        ValueError, DatasetError, CheckpointError: bad input, before training.
        TrainingDivergedError: the loss or a weight became nan/inf.
        DistributedError: a process of a several-process run failed.
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"fit() got unknown option(s) {unknown}; the settings are "
                        f"{', '.join(sorted(_OPTIONS))}.")
    cfg = TrainConfig(model=model, dataset=data, task=task, epochs=epochs, optimizer=optimizer,
                      nprocs=nprocs, memory_budget=memory_budget, storage=storage,
                      device=device, checkpoint=checkpoint, patience=patience, runs=runs,
                      seed=seed, progress=progress, **options)
    outcome = run(cfg, echo)
    return TrainResult(outcome.model, outcome.summary, outcome.meta)
