"""One run's configuration: :class:`TrainConfig`, checked before any data is loaded.

Every ``ngra train`` flag maps to one field, and :func:`ngra.fit`'s keyword arguments
are the same names. ``model`` is a zoo name, ``module:callable``, a factory or a module
(:class:`~ngra.training.model_source.ModelSource`); ``dataset`` a spec string or data in
memory (:func:`~ngra.training.data.as_dataset`). :meth:`TrainConfig.resolved` is the
configuration as the run used it (hyper-parameters filled in, each with its source in
:meth:`TrainConfig.hyper_parameters`), which the JSON summary and checkpoints record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from ngra.datasets.store import STORAGES
from ngra.distributed.cost import STRATEGIES
from ngra.distributed.halo import HALO_BITS
from ngra.models import HYPER_PARAMETERS, MODELS, Hyper
from ngra.partition import BOOK_METHODS
from ngra.runtime.cuda_graph import MODES as CUDA_GRAPH_MODES
from ngra.training.model_source import ModelSource

__all__ = ["NEGATIVES", "TASKS", "TrainConfig", "check_config", "check_run_files",
           "describe_run"]

#: What a run can learn: node classification, link prediction, graph classification.
TASKS = ("node", "link", "graph")
#: Link-prediction decoders, and graph readouts, by name (:mod:`ngra.training.link_task`, :mod:`ngra.training.graph_task`).
DECODERS = ("dot", "mlp", "distmult")
#: How link prediction draws its training negatives (:mod:`ngra.datasets.negatives`).
NEGATIVES = ("uniform", "degree")
READOUTS = ("sum", "mean", "max", "attention")

@dataclass
class TrainConfig:
    """One training run. Every CLI flag of ``ngra train`` maps to one field.

    ``None`` hyper-parameters take the model's defaults (``ngra.models.MODELS``, sources in
    :func:`ngra.models.defaults_table`); a value for a setting the model has not (``heads``
    for GCN) or out of range (``hidden=0``) is refused by :meth:`resolved`.
    ``normalize_features=None`` takes the model's (``ModelSpec.normalize_features``).
    ``runs``: seeds ``seed .. seed + runs - 1``; ``patience``: early stop (``None``: off).
    """

    model: Any = "gcn"
    dataset: Any = "sbm"
    task: str = "node"
    #: link and graph tasks: held-out fractions (edges, graphs), the encoder's output width
    val: float = 0.05
    test: float = 0.1
    embedding_dim: int = 64
    decoder: str = "dot"
    negatives: str = "uniform"
    readout: str = "sum"
    batch_size: int = 128
    epochs: int = 200
    seed: int = 0
    hidden: int | None = None
    heads: int | None = None
    num_layers: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    dropout: float | None = None
    attention_dropout: float | None = None
    normalize_features: bool | None = None
    runs: int = 1
    patience: int | None = None
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
    cuda_graphs: str = "auto"
    nprocs: int = 1
    #: start --nprocs / --threads past the machine's memory and cores (else refused / warned)
    allow_oversubscribe: bool = False
    #: train when the train / validation / test masks share vertices (else refused)
    allow_split_overlap: bool = False
    exchange: str = "auto"
    #: the halo exchange overlaps the edges whose sources a rank owns (else it blocks)
    halo_overlap: bool = True
    #: halo rows travel quantized to this many bits with a per-row scale (None: exact)
    halo_bits: int | None = None
    #: a training step reads the previous step's halo rows and gradients (0: exact)
    halo_staleness: int = 0
    partition: str | None = None
    partition_method: str = "metis"
    dist_timeout: float = 300.0
    storage: str = "memory"
    plan: str | None = None
    #: ``optimizer(model) -> torch.optim.Optimizer`` (default: Adam with ``lr`` and
    #: ``weight_decay``, GCN's first-layer-only decay); Python only, not a CLI flag
    optimizer: Any = None
    #: entries the run adds to its JSON summary (the dense layers' plan); not configuration
    extra: dict = field(default_factory=dict)

    @cached_property
    def source(self) -> ModelSource:
        """What :attr:`model` names (a zoo model, a factory or a module)."""
        return ModelSource.of(self.model)

    @property
    def model_name(self) -> str:
        return self.source.name

    @property
    def dataset_name(self) -> str:
        d = self.dataset
        if isinstance(d, str):
            return d
        if isinstance(d, dict):
            return str(d.get("name", "tensors"))
        if hasattr(d, "ndata"):
            return "dgl"
        if hasattr(d, "edge_index") and not hasattr(d, "info"):
            return "pyg"
        info = getattr(d, "info", None)
        return (info or {}).get("spec") or getattr(d, "name", None) or type(d).__name__

    def hyper_parameters(self) -> dict[str, Hyper | None]:
        """``{name: Hyper(value, source) or None}`` (the zoo's table, or a user model's
        given values and defaults: :meth:`ModelSource.hyper_parameters`)."""
        return self.source.hyper_parameters({k: getattr(self, k) for k in HYPER_PARAMETERS},
                                            self.task)

    def resolved(self) -> dict[str, Any]:
        """Every field, hyper-parameters filled in from the model's defaults."""
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("extra", "optimizer")}
        d["optimizer"] = None if self.optimizer is None else getattr(
            self.optimizer, "__qualname__", repr(self.optimizer))
        d["model"], d["dataset"] = self.model_name, self.dataset_name
        d.update({k: h and h.value for k, h in self.hyper_parameters().items()})
        decay_first = self.source.zoo and MODELS[self.model_name].decay_first_layer_only
        if self.source.zoo and self.num_layers is None:
            d["num_layers"] = 2
        d["weight_decay_on"] = "first layer" if decay_first else "every layer"
        if self.normalize_features is None:
            d["normalize_features"] = self.source.normalize_features()
        return d


def describe_run(cfg: TrainConfig, synthesized: list[str] | None = None) -> str:
    """The hyper-parameters a run uses and where each comes from (printed at its start)."""
    hp = {k: h for k, h in cfg.hyper_parameters().items() if h is not None}
    given = [k for k, h in hp.items() if h.source == "given"]
    sources = sorted({h.source for h in hp.values() if h.source != "given"})
    values = " ".join(f"{k}={h.value:g}" for k, h in hp.items())
    layers = cfg.resolved()["num_layers"]
    lines = [f"ngra train {cfg.model_name} on {cfg.dataset_name}: {values}"
             + (f" num_layers={layers}" if layers is not None else "")
             + f" epochs={cfg.epochs} seed={cfg.seed}"]

    if given:
        lines.append(f"  given: {', '.join(given)}")
    lines += [f"  model default: {', '.join(k for k, h in hp.items() if h.source == src)} "
              f"from {src}" for src in sources]
    if synthesized:
        lines.append(f"  note: the dataset's {' and '.join(synthesized)} are synthesized, not "
                     "real (a generated graph, or an edge list without features=/labels=)")
    return "\n".join(lines)


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



#: What the exchanges that are not the halo move, exactly (the halo's options refused).
_EXACT = {"ring": "streams exact chunks", "feature": "transposes exact columns"}


def check_config(cfg: TrainConfig) -> None:
    """Refuse a configuration that cannot run, before any data is loaded."""
    cfg.source  # a model that does not resolve is refused here  # noqa: B018
    if cfg.task not in TASKS:
        raise ValueError(f"task {cfg.task!r}: ngra trains {', '.join(TASKS)} tasks.")
    if cfg.task != "node":
        for name, why, where in (
                ("device", str(cfg.device) != "cpu", f"--task {cfg.task} trains on the CPU"),
                ("storage", cfg.storage != "memory" and cfg.task == "graph",
                 "--task graph keeps its graphs in memory"),
                ("plan", cfg.plan is not None,
                 f"--task {cfg.task} trains its dense layers data-parallel")):
            if why:
                raise ValueError(f"{where} for now; drop --{name}.")
        if cfg.negatives not in NEGATIVES:
            raise ValueError(f"--negatives must be one of {NEGATIVES}; got {cfg.negatives!r}.")
        if cfg.decoder not in DECODERS:
            raise ValueError(f"--decoder must be one of {DECODERS}; got {cfg.decoder!r}.")
        if cfg.readout not in READOUTS:
            raise ValueError(f"--readout must be one of {READOUTS}; got {cfg.readout!r}.")
        for name in ("embedding_dim", "batch_size"):
            v = getattr(cfg, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1; "
                                 f"got {v!r}.")
        if not (0 <= cfg.val < 1 and 0 < cfg.test < 1 and cfg.val + cfg.test < 1):
            raise ValueError(f"--val and --test are fractions held out (val in [0, 1), test in "
                             f"(0, 1), summing below 1); got {cfg.val} and {cfg.test}.")
    if cfg.source.kind == "module" and cfg.runs > 1:
        raise ValueError(f"runs={cfg.runs} trains a fresh model per seed, which needs a "
                         "factory (a callable or module:callable that builds the model), "
                         f"not a built module ({cfg.source.name}).")
    if cfg.num_layers is not None and (isinstance(cfg.num_layers, bool) or
                                       not isinstance(cfg.num_layers, int) or cfg.num_layers < 1):
        raise ValueError(f"--num-layers must be an integer >= 1; got {cfg.num_layers!r}.")
    cfg.hyper_parameters()  # values out of range, settings the model has not
    for name in ("epochs", "runs", "patience"):
        v = getattr(cfg, name)
        if name == "patience" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"--{name} must be an integer >= 1; got {v!r}."
                             + (" Leave it out to train every epoch up to --epochs."
                                if name == "patience" else ""))
    if isinstance(cfg.nprocs, bool) or not isinstance(cfg.nprocs, int) or cfg.nprocs < 1:
        raise ValueError(f"--nprocs must be an int >= 1 (processes to train on); "
                         f"got {cfg.nprocs!r}.")
    if cfg.exchange not in STRATEGIES:
        raise ValueError(f"--exchange must be one of {STRATEGIES}; got {cfg.exchange!r}.")
    if not isinstance(cfg.halo_overlap, bool):
        raise ValueError(f"halo_overlap must be True or False (--halo-overlap / "
                         f"--no-halo-overlap); got {cfg.halo_overlap!r}.")
    if cfg.halo_bits is not None:
        if isinstance(cfg.halo_bits, bool) or cfg.halo_bits not in HALO_BITS:
            raise ValueError(f"--halo-bits must be 8 (8-bit halo rows with a per-row scale; "
                             f"leave it out for exact halos); got {cfg.halo_bits!r}.")
        if cfg.exchange in ("ring", "feature"):
            raise ValueError(f"--halo-bits {cfg.halo_bits} quantizes the halo exchange, and "
                             f"--exchange {cfg.exchange} {_EXACT[cfg.exchange]}; use --exchange "
                             "halo (or auto: layers the cost model sends another way stay "
                             "exact).")
    if isinstance(cfg.halo_staleness, bool) or cfg.halo_staleness not in (0, 1):
        raise ValueError(f"--halo-staleness must be 0 (exact) or 1 (a step reads the previous "
                         f"step's halo, PipeGCN's bound); got {cfg.halo_staleness!r}.")
    if cfg.halo_staleness:
        if not cfg.halo_overlap:
            raise ValueError("--halo-staleness 1 lets the overlapped halo travel for a whole "
                             "step; it cannot go with --no-halo-overlap.")
        if cfg.exchange in ("ring", "feature"):
            raise ValueError(f"--halo-staleness 1 delays the halo exchange, and --exchange "
                             f"{cfg.exchange} {_EXACT[cfg.exchange]}; use --exchange halo (or "
                             "auto).")
    if cfg.partition_method not in BOOK_METHODS:
        raise ValueError(f"--partition-method must be one of {BOOK_METHODS}; "
                         f"got {cfg.partition_method!r}.")
    if cfg.plan is not None and cfg.nprocs < 2:
        raise ValueError(f"--plan {cfg.plan} chooses how --nprocs K processes split the dense "
                         "layers; give --nprocs 2 or more.")
    if cfg.plan not in (None, "auto") and not Path(cfg.plan).is_file():
        raise ValueError(f"--plan {cfg.plan}: expected auto or a plans file (ngra plan --out "
                         "FILE); no such file.")
    if not cfg.dist_timeout > 0:
        raise ValueError(f"--dist-timeout must be > 0 seconds; got {cfg.dist_timeout}.")
    if cfg.cuda_graphs not in CUDA_GRAPH_MODES:
        raise ValueError(f"--cuda-graphs must be one of {CUDA_GRAPH_MODES}; "
                         f"got {cfg.cuda_graphs!r}.")
    if cfg.cuda_graphs == "on":
        why = ("it runs on the CPU" if not str(cfg.device).startswith("cuda") else
               "--memory-budget tiles the graph on a grid chosen at run time"
               if cfg.memory_budget else
               "--nprocs all-reduces gradients between backward and the optimizer step"
               if cfg.nprocs > 1 else None)
        if why is not None:
            raise ValueError(f"--cuda-graphs on captures a device-resident training step in "
                             f"a CUDA graph, and this run cannot have one: {why}. Use "
                             "--cuda-graphs auto (or off).")
    if cfg.storage not in STORAGES:
        raise ValueError(f"--storage must be one of {STORAGES}; got {cfg.storage!r}.")
    if cfg.storage != "memory" and cfg.nprocs > 1:
        raise ValueError(f"--storage {cfg.storage} trains one process from the dataset cache; "
                         "with --nprocs each rank reads its own shard into memory. Drop one.")
