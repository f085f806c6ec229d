"""Full-graph node-classification training: ``train(TrainConfig(...))``, ``ngra train``.

``train`` loads the dataset, builds the zoo model, trains full-graph for ``epochs``
epochs (tqdm progress) with :func:`ngra.fit.fit`, keeps the weights with the best
validation accuracy, and returns (and optionally writes as JSON) a summary with
``test_acc``, ``val_acc``, ``epochs``, ``epoch_time_s`` (median), ``peak_rss_mb`` and the
resolved ``config``. Several seeds (``runs``), early stop (``patience``), checkpoints,
resuming and the divergence check: see :mod:`ngra.fit`.
Nothing runs on meaningless input: before training the configuration
(:func:`check_config`, :func:`check_run_files`) and the dataset
(:func:`ngra.datasets.check_trainable`, :func:`check_predictions_vary`) are checked.

With ``nprocs > 1`` (or inside ranks started by ``torchrun``) the run is spread over
processes holding a partitioned graph (:mod:`ngra.distributed.trainer`), the same loop
on every rank.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from ngra.errors import DatasetError
from ngra.fit import (EarlyStop, Session, check_finite, evaluate, fit_runs, grid_report,
                      normalize_features, prepare_dataset, reorder_dataset,
                      resume_from_checkpoint)
from ngra.memstat import rss_bytes
from ngra.models import HYPER_PARAMETERS, MODELS, build_model, hyper_parameters, prepare
from ngra.partition import parse_bytes
from ngra.runtime.placement import (Placement, move_to, plan_placement, resident_bytes,
                                    resolve_device)

__all__ = ["TrainConfig", "EarlyStop", "train", "check_config", "check_finite",
           "check_predictions_vary", "check_run_files", "describe_run", "evaluate",
           "grid_report", "normalize_features", "reorder_dataset", "resume_from_checkpoint"]

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """One training run. Every CLI flag of ``ngra train`` maps to one field.

    ``None`` hyper-parameters take the model's defaults (``ngra.models.MODELS``, sources in
    :func:`ngra.models.defaults_table`); a value for a setting the model has not (``heads``
    for GCN) or out of range (``hidden=0``) is refused by :meth:`resolved`.
    ``normalize_features=None`` takes the model's (``ModelSpec.normalize_features``).
    ``runs``: seeds ``seed .. seed + runs - 1``; ``patience``: early stop (``None``: off).
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
    exchange: str = "auto"
    partition: str | None = None
    partition_method: str = "metis"
    dist_timeout: float = 300.0
    storage: str = "memory"
    plan: str | None = None
    #: entries the run adds to its JSON summary (the dense layers' plan); not configuration
    extra: dict = field(default_factory=dict)

    def hyper_parameters(self) -> dict[str, Any]:
        """``{name: Hyper(value, source) or None}`` (see :func:`ngra.models.hyper_parameters`)."""
        return hyper_parameters(self.model, **{k: getattr(self, k) for k in HYPER_PARAMETERS})

    def resolved(self) -> dict[str, Any]:
        """Every field, hyper-parameters filled in from the model's defaults."""
        d = asdict(self)
        del d["extra"]
        d.update({k: h and h.value for k, h in self.hyper_parameters().items()})
        spec = MODELS[self.model]
        d["weight_decay_on"] = "first layer" if spec.decay_first_layer_only else "every layer"
        if self.normalize_features is None:
            d["normalize_features"] = spec.normalize_features
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


def train(cfg: TrainConfig, echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train per ``cfg``; returns the JSON summary (also written to ``cfg.out``).

    With ``cfg.runs = K > 1`` the model trains K times, with seeds ``seed .. seed + K - 1``
    on the same data (:func:`ngra.fit.fit_runs`).

    With ``cfg.explain`` the compiled plan of every layer is put in the summary
    (``"explain"``) and handed to ``echo`` (default: logged at INFO) before training.
    With ``cfg.nprocs > 1`` the run is spread over that many processes
    (:func:`ngra.distributed.trainer.train_distributed`).
    """
    from ngra.datasets import check_trainable, load

    from ngra.distributed.launch import in_worker

    check_config(cfg)
    check_run_files(cfg)
    resolved = cfg.resolved()
    if os.environ.get("RANK", "0") == "0":  # once, not on every torchrun rank
        log.info("ngra train config: %s", json.dumps(resolved, sort_keys=True))
        (echo or log.info)(describe_run(cfg))
    if cfg.plan is not None:
        from ngra.planner.zoo import training_plan

        if in_worker():
            raise ValueError("--plan is not supported under torchrun; start the processes "
                             "with ngra train --nprocs K --plan ...")
        cfg = replace(cfg, extra={**cfg.extra, "plan": training_plan(cfg)})
        (echo or log.info)(f"dense layers: plan {cfg.extra['plan']['used']['label']} "
                           f"(--plan {cfg.plan})")
    if cfg.nprocs > 1 or in_worker():
        from ngra.distributed.trainer import train_distributed

        return train_distributed(cfg, echo)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)

    budget = parse_bytes(cfg.memory_budget) if cfg.memory_budget else None
    ds = load(cfg.dataset, root=cfg.data_root, storage=cfg.storage, budget=budget)
    check_trainable(ds, cfg.dataset)
    ds = prepare_dataset(cfg, ds)
    about = {"reciprocity": ds.reciprocity, "dataset_summary": ds.summary()}  # the data's graph
    graph, edge_data = prepare(cfg.model, ds.graph, ds.edge_type, ds.num_edge_types)
    num_nodes, num_edges, num_edge_types = ds.graph.num_nodes, ds.graph.num_edges, ds.num_edge_types
    if graph is not ds.graph:  # the model's graph replaces the dataset's: one copy alive
        ds = replace(ds, graph=graph, edge_type=None, num_edge_types=1)
    masks = {"train": ds.train_mask, "val": ds.val_mask, "test": ds.test_mask}
    about["resident_mb"] = rss_bytes() / 2**20  # data in memory (or mapped) and prepared
    about["storage"] = ds.info.get("storage", "memory")

    def session(seed: int) -> Session:  # one run's model, seeded by fit_runs
        model = build_model(cfg.model, ds.x.shape[1], ds.num_classes, hidden=resolved["hidden"],
                            heads=resolved["heads"], num_layers=cfg.num_layers,
                            num_edge_types=num_edge_types, dropout=resolved["dropout"],
                            attention_dropout=resolved["attention_dropout"])
        placement = _placement(device, cfg, graph, ds.x, model,
                               [ds.y, edge_data, *masks.values()])
        log.info("placement: %s", placement.describe())
        g, x, y, e, m = graph, ds.x, ds.y, edge_data, masks
        if device.type == "cuda" and placement.resident:
            g, x, y, e, model = move_to(device, g, x, y, e, model)
            m = dict(zip(m, move_to(device, *m.values())))
        elif device.type == "cuda":  # streaming: the parameters live on the device
            (model,) = move_to(device, model)
        check_predictions_vary(model, g, x, e, cfg.model, cfg.dataset)
        return Session(model, g, x, e, y, m, cfg.memory_budget, num_nodes, num_edges,
                       device, placement, about)

    return fit_runs(cfg, session, echo)


def check_config(cfg: TrainConfig) -> None:
    """Refuse a configuration that cannot run, before any data is loaded."""
    from ngra.datasets.store import STORAGES
    from ngra.distributed.cost import STRATEGIES
    from ngra.partition import BOOK_METHODS
    from ngra.runtime.cuda_graph import MODES as CUDA_GRAPH_MODES

    if cfg.model not in MODELS:
        raise ValueError(f"unknown model {cfg.model!r}; choose one of {sorted(MODELS)}.")
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
