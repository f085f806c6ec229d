"""The JSON summary of a training run: one schema, whatever the process count or device.

Every run's summary (``ngra train --out``, :meth:`ngra.training.TrainResult.to_json`)
holds every key of :data:`FIELDS`, in that order, ``null`` where it does not apply (a
one-process run's ``world_size`` is 1, its ``bytes_sent_per_epoch`` null; a run on the
CPU has a null ``peak_device_mb``). Several seeds (``runs > 1``) fill the ``*_mean`` /
``*_std`` keys and list every run's own summary, in the same schema, under ``results``;
their per-run keys (``seed``, ``test_acc``, ``history``, ...) are then null at the top.
A key's meaning is the text beside it below; :data:`SCHEMA_VERSION` changes when a key
changes meaning or goes away.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

__all__ = ["FIELDS", "SCHEMA_VERSION", "finish_summary", "summarize_runs"]

log = logging.getLogger(__name__)

#: Bumped when a key changes meaning or is removed (adding keys keeps it).
SCHEMA_VERSION = 1

#: Every key of a summary and what it holds.
FIELDS: dict[str, str] = {
    "schema_version": "this schema's version (SCHEMA_VERSION)",
    "model": "the zoo name, or the factory's module:callable / the module's class",
    "dataset": "the dataset spec, or the name of data given in memory",
    "task": "what was learned: node (classification), link (prediction), graph "
            "(classification)",
    "metric": "what test_acc / val_acc measure: accuracy (node, graph), roc_auc (link), or "
              "a binary graph dataset's OGB metric, roc_auc or ap",
    "runs": "how many seeds were trained",
    "seeds": "the seeds, seed .. seed + runs - 1",
    "seed": "this run's seed (null over several runs)",
    "test_acc": "the task's metric on the test part at the selected epoch (the best "
                "validation value): accuracy, ROC-AUC for link prediction, or a binary "
                "graph dataset's roc_auc / ap",
    "val_acc": "the selected epoch's validation value of the metric",
    "metrics": "more metrics at the selected epoch (link: Hits@20/50/100, ROC-AUC per part; "
               "binary graph tasks: roc_auc and ap per part)",
    "best_epoch": "the selected epoch (1-based)",
    "epochs": "epochs trained",
    "stopped_early": "whether --patience stopped the run before --epochs",
    "final_loss": "the last epoch's training loss",
    "test_acc_mean": "mean test accuracy over the runs (one run: its own)",
    "test_acc_std": "sample std of the test accuracy over the runs (null for one run)",
    "val_acc_mean": "mean validation accuracy over the runs",
    "val_acc_std": "sample std of the validation accuracy (null for one run)",
    "epochs_mean": "mean epochs trained", "epochs_std": "their sample std (null for one run)",
    "best_epoch_mean": "mean selected epoch",
    "best_epoch_std": "its sample std (null for one run)",
    "epoch_time_s": "median seconds of a training step (forward, backward, optimizer)",
    "peak_rss_mb": "peak resident memory (MiB), the largest rank's with several processes",
    "peak_device_mb": "peak GPU memory allocated (MiB), the largest rank's; null on the CPU",
    "num_nodes": "vertices of the dataset's graph",
    "num_edges": "edges of the dataset's graph (before the model's self-loops)",
    "config": "the configuration as run (hyper-parameters resolved)",
    "config_sources": "where each hyper-parameter came from (given, or its default's source)",
    "reciprocity": "share of edges whose reverse is an edge",
    "dataset_summary": "the dataset's sizes, split and direction (NodeDataset.summary())",
    "synthesized": "what of the data was synthesized (features, labels), [] for real data",
    "device": "where training ran (cpu, cuda:0)",
    "placement": "device placement: resident or streamed, with the budget (null on the CPU "
                 "with several processes)",
    "storage": "memory or disk (where the dataset's arrays live)",
    "resident_mb": "resident memory after loading and preparing the data (MiB; the largest "
                   "rank's with several processes)",
    "disk_read_mb": "bytes read from disk during training (MiB)",
    "cuda_graph": "captured, or why the step was not captured in a CUDA graph",
    "h2d_mb_per_epoch": "streamed through a GPU: host-to-device MiB a step (else null)",
    "d2h_mb_per_epoch": "streamed: device-to-host MiB a step",
    "copy_bandwidth_gbs": "streamed: the measured page-locked copy bandwidth each way",
    "transfer_bound_s": "streamed: the step's bytes at that bandwidth",
    "epoch_over_transfer_bound": "streamed: the median step over the transfer bound",
    "world_size": "processes the run trained on (1 for one)",
    "exchange": "several processes: each layer's graph exchange (halo or ring)",
    "exchange_per_layer": "several processes: per layer, how its exchange ran (halo, halo "
                          "(blocking), ring), training calls recorded and, rank by rank, "
                          "the last call's bytes sent forward and backward and the median "
                          "seconds a call was blocked waiting for the exchange",
    "bytes_sent_per_epoch": "several processes: bytes each rank sent in a training step",
    "partition": "several processes: the partition's figures (edge cut, halo, balance)",
    "partition_stats": "several processes: the cost model's inputs",
    "peak_rss_mb_per_rank": "several processes: each rank's peak resident memory (MiB)",
    "peak_device_mb_per_rank": "several processes on GPUs: each rank's peak device memory",
    "memory_per_rank": "several processes: each rank's peak_rss (VmHWM, bytes), "
                       "required_bytes (what its partition requires, ngra.distributed.memory; "
                       "required: by part) and fixed_bytes (its RSS before its shard)",
    "stale_halos_resumed": "--halo-staleness 1, resumed: what its first step read (the "
                           "checkpoint's stale halos, or exact halos and why)",
    "epoch_time_s_per_rank": "several processes: each rank's median step",
    "large_frees_released": "several processes: large temporaries returned to the OS",
    "link": "several processes: the link model that chose the exchange",
    "dense_layout": "several processes: how a --plan split the dense layers",
    "plan": "--plan: the dense layers' plan used (and the planner's top pick)",
    "explain": "--explain: each layer's compiled plan as text",
    "history": "per epoch: loss, train/val/test accuracy, val_loss",
    "results": "several runs: each run's summary in this schema (null for one run)",
}

#: Keys a run of several seeds takes from its first run.
_SHARED = ("metric", "config", "config_sources", "num_nodes", "num_edges", "device", "placement",
           "reciprocity", "dataset_summary", "synthesized", "storage", "resident_mb", "task",
           "world_size", "exchange", "exchange_per_layer", "partition", "partition_stats", "link",
           "dense_layout",
           "cuda_graph", "copy_bandwidth_gbs")


def finish_summary(run: dict[str, Any]) -> dict[str, Any]:
    """One run's summary in the schema: every key of :data:`FIELDS`, in order, ``null``
    where the run has none, the one-run ``*_mean``/``*_std`` filled in."""
    out = {k: run.get(k) for k in FIELDS}
    out["schema_version"] = SCHEMA_VERSION
    out["task"] = out["task"] or (run.get("config") or {}).get("task", "node")
    out["runs"], out["seeds"] = 1, [run.get("seed")]
    out["world_size"] = run.get("world_size", 1)
    for key in ("test_acc", "val_acc", "epochs", "best_epoch"):
        out[f"{key}_mean"] = run.get(key)
        out[f"{key}_std"] = None
    unknown = sorted(set(run) - set(FIELDS))
    if unknown:  # a key a run wrote that the schema does not know: a bug to fix here
        log.warning("summary keys left out (not in ngra.training.summary.FIELDS): %s", unknown)
    return out


def summarize_runs(model: str, dataset: str, results: list[dict[str, Any]],
                   extra: dict[str, Any]) -> dict[str, Any]:
    """The summary of several seeds' runs: every run (each in the schema), and mean /
    sample std of the accuracies, epochs and best epochs."""
    runs = [finish_summary(r) for r in results]
    first = runs[0]
    out = {k: None for k in FIELDS}
    out.update(schema_version=SCHEMA_VERSION, model=model, dataset=dataset, runs=len(runs),
               seeds=[r["seed"] for r in runs])
    for key in ("test_acc", "val_acc", "epochs", "best_epoch"):
        vals = [float(r[key]) for r in runs]
        out[f"{key}_mean"] = statistics.fmean(vals)
        out[f"{key}_std"] = statistics.stdev(vals)
    out["epoch_time_s"] = statistics.median(r["epoch_time_s"] for r in runs)
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    devices = [r["peak_device_mb"] for r in runs if r["peak_device_mb"] is not None]
    out["peak_device_mb"] = max(devices) if devices else None
    out["disk_read_mb"] = sum(r["disk_read_mb"] or 0.0 for r in runs)
    out.update({k: first[k] for k in _SHARED})
    out.update({k: v for k, v in extra.items() if k in FIELDS})
    if first["explain"] is not None:
        out["explain"], first["explain"] = first["explain"], None
    out["results"] = runs
    return out
