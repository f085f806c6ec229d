"""A trained model, ready for new data: :func:`load_model` and :class:`Predictor`.

A checkpoint folder (``ngra train --checkpoint DIR``, ``ngra.fit(..., checkpoint=DIR)``,
:meth:`ngra.training.TrainResult.save`) holds the selected weights and the metadata that
rebuilds the model (:mod:`ngra.training.checkpoint`). :func:`load_model` reads it with
``weights_only=True``, rebuilds the model (the zoo's builder, or the factory by its
``module:callable``; a model given in memory needs ``model=`` again) and returns a
:class:`Predictor`, which prepares any data as training did (the zoo's graph
preparation, the feature row-normalization the run used) and returns class scores,
labels or the output of a named layer (embeddings) for every vertex. Evaluation is
deterministic (:mod:`ngra.kernels`' fixed reduction order): a reloaded model gives
bit-identical outputs to the one that was saved. :func:`save_predictions` writes them
(``ngra predict --out``) whole or not at all (:func:`ngra.diskspace.atomic_output`): a
full disk is a :class:`~ngra.errors.DiskFullError`, a previous file is left as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ngra.diskspace import atomic_output
from ngra.errors import CheckpointError, DatasetError
from ngra.graph import Graph
from ngra.training.checkpoint import FORMAT_VERSION, load_latest_checkpoint
from ngra.training.data import as_dataset, normalize_features
from ngra.datasets import GraphLoader
from ngra.training.model_source import ModelSource, call_model
from ngra.training.graph_task import GraphModel, graph_dataset
from ngra.training.link_task import LinkModel, make_decoder

__all__ = ["OUTPUTS", "Predictor", "load_model", "save_predictions"]

#: What :meth:`Predictor.predict` returns per vertex.
OUTPUTS = ("labels", "scores", "probabilities")


class Predictor:
    """A model with the preparation it trained with (module docstring).

    Attributes:
        model: the ``nn.Module`` (eval mode), holding the selected weights.
        meta: the run's metadata (model, hyper-parameters, feature normalization, the
            training data's fingerprint and sizes).
    """

    def __init__(self, model: nn.Module, meta: dict[str, Any]) -> None:
        self.model = model.eval()
        self.meta = meta
        self.source = _source(meta)

    def prepare(self, data: Any, *, root: str | None = None) -> tuple[Graph, torch.Tensor, Any]:
        """``(graph, x, edge_data)`` of ``data`` (a spec string, a ``NodeDataset``, PyG
        ``Data``, DGL graph, or a dict with ``edge_index`` and ``x``) as the model trained
        on such data."""
        ds = as_dataset(data, root=root, check=False)  # no labels needed to predict
        want = self.meta.get("num_features")
        if want is not None and ds.num_features != want:
            raise DatasetError(f"the model was trained on {want} features a vertex; this data "
                               f"has {ds.num_features} (x is {list(ds.x.shape)}).")
        if self.meta.get("normalize_features"):
            ds = normalize_features(ds)
        graph, edge_data = self.source.prepare(ds.graph, ds.edge_type, ds.num_edge_types)
        return graph, ds.x, edge_data

    @torch.no_grad()
    def predict(self, data: Any, *, output: str = "labels", embeddings: str | None = None,
                root: str | None = None, pairs: torch.Tensor | None = None,
                relations: torch.Tensor | None = None) -> torch.Tensor:
        """Per vertex of ``data``: ``labels`` (``[N]`` int64), ``scores`` (``[N, C]``
        logits) or ``probabilities`` (softmax), or with ``embeddings="layers.0"`` the
        output of that submodule (``dict(model.named_modules())``'s names).

        A link-prediction model gives each vertex's embedding ``[N, D]``, or with
        ``pairs`` (``[2, P]``) each pair's probability of being an edge (a DistMult
        model: of being an edge of ``relations``, ``[P]`` relation ids). A
        graph-classification model takes a collection of graphs (``tu:PATH``, a
        ``GraphDataset``) and gives one label (or row of scores) per graph; on a binary
        dataset of ``T`` tasks (OGB's molecules) a row of ``T`` per graph: 0/1 labels
        (logit > 0), logits, or sigmoid probabilities.

        Raises:
            ValueError: an unknown ``output`` or layer name (the names are listed).
        """
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}; got {output!r}.")
        task = self.meta.get("task", "node")
        if task == "graph" and embeddings is None:
            return self._predict_graphs(data, output, root)
        graph, x, edge_data = self.prepare(data, root=root)
        if task == "link" and embeddings is None:
            z = call_model(self.model, graph, x, edge_data)
            if pairs is None:
                return z
            return torch.sigmoid(self.model.decoder(z, pairs, relations))
        if embeddings is None:
            out = call_model(self.model, graph, x, edge_data)
            if output == "labels":
                return out.argmax(-1)
            return out.softmax(-1) if output == "probabilities" else out
        modules = dict(self.model.named_modules())
        if embeddings not in modules or not embeddings:
            names = [n for n in modules if n]
            raise ValueError(f"the model has no layer {embeddings!r}; its layers are "
                             f"{', '.join(names)}.")
        seen: list[torch.Tensor] = []
        hook = modules[embeddings].register_forward_hook(
            lambda _m, _a, out: seen.append(out if isinstance(out, torch.Tensor) else out[0]))
        try:
            call_model(self.model, graph, x, edge_data)
        finally:
            hook.remove()
        return seen[-1]


    def _predict_graphs(self, data: Any, output: str, root: str | None) -> torch.Tensor:
        ds = graph_dataset(data, root=root)
        outs = [self.model(b.graph, b.x, b.ptr) for b in GraphLoader(ds, 256)]
        out = torch.cat(outs) if outs else torch.empty(0, self.meta["num_classes"])
        if self.meta.get("task_type") == "binary":  # one logit per task
            if output == "labels":
                return (out > 0).long()
            return out.sigmoid() if output == "probabilities" else out
        if output == "labels":
            return out.argmax(-1)
        return out.softmax(-1) if output == "probabilities" else out


def save_predictions(values: np.ndarray, path: str | os.PathLike[str],
                     label: str | None = None) -> Path:
    """Write ``values`` (``[N]`` or ``[N, D]``) to ``path``: ``.npy`` (the array) or
    ``.csv`` (a ``vertex`` column, then ``label`` when given and the array is ``[N]``,
    else ``v0, v1, ...``), whole or not at all (module docstring)."""
    path = Path(path)
    if path.suffix not in (".npy", ".csv"):
        raise ValueError(f"--out {path}: expected a .npy or .csv file name.")
    what = f"the predictions ({len(values)} rows)"
    if path.suffix == ".npy":
        with atomic_output(path, what, values.nbytes + 4096) as fh:  # and the .npy header
            np.save(fh, values)
        return path
    table = values.reshape(len(values), -1)
    ids = np.arange(len(table)).reshape(-1, 1)
    head = "vertex," + (label if label and values.ndim == 1
                        else ",".join(f"v{i}" for i in range(table.shape[1])))
    ints = table.dtype.kind in "iu"
    fmt = ["%d"] + (["%d"] if ints else ["%.8g"]) * table.shape[1]
    with atomic_output(path, what) as fh:  # text: its size is known once written
        np.savetxt(fh, np.hstack([ids, table]) if ints else np.column_stack([ids, table]),
                   delimiter=",", header=head, comments="", fmt=fmt)
    return path


def _source(meta: dict[str, Any]) -> ModelSource:
    record = meta.get("model") or {}
    if record.get("kind") == "zoo":
        return ModelSource("zoo", record["name"])
    return ModelSource("module", record.get("name", "model"))


def load_model(directory: str | Path, model: Any = None) -> Predictor:
    """The model a checkpoint folder holds, as a :class:`Predictor`.

    ``model``: for a checkpoint of a model that cannot be rebuilt by name (a module or a
    factory given in memory), the module to load the weights into, or its factory.

    Raises:
        FileNotFoundError: no checkpoint in ``directory``.
        CheckpointError: the checkpoint is damaged, of an older format, or its weights do
            not fit the model (a checkpoint of another model).
    """
    ck, path = load_latest_checkpoint(directory, ("format", "meta", "model"))
    if ck["format"] != FORMAT_VERSION:
        raise CheckpointError(path, f"checkpoint {path} has format {ck['format']!r}; this ngra "
                                    f"reads format {FORMAT_VERSION}.")
    meta = ck["meta"]
    record = meta.get("model") or {}
    if model is None:
        if not (record.get("kind") == "zoo" or record.get("importable")):
            raise CheckpointError(path, f"checkpoint {path} holds {record.get('name')}, which "
                                        "cannot be rebuilt by name (it was given as a module or "
                                        "a local function); pass it again: "
                                        "load_model(DIR, model=...).")
        source = ModelSource.of(record["name"])
    else:
        source = ModelSource.of(model)
    hyper = meta.get("hyper") or {}
    task = meta.get("task", "node")
    width = meta["num_classes"] if task == "node" else meta["embedding_dim"]
    if source.zoo:
        net = source.build(meta["num_features"], width, hyper=hyper,
                           num_layers=hyper.get("num_layers"),
                           num_edge_types=meta.get("num_edge_types", 1))
    elif source.kind == "module":
        net = source.module
    else:
        kwargs = meta.get("factory_kwargs", {}) if record.get("kind") == "factory" else {}
        net = source.factory(meta["num_features"], width, **kwargs)
        if not isinstance(net, nn.Module):
            raise TypeError(f"model factory {source.name} returned a {type(net).__name__}, "
                            "not an nn.Module.")
    if task == "link":
        net = LinkModel(net, make_decoder(meta["decoder"], width, meta.get("num_relations", 1)))
    elif task == "graph":
        net = GraphModel(net, width, meta["num_classes"], meta["readout"])
    try:
        net.load_state_dict(ck["model"])
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise CheckpointError(path, f"checkpoint {path} was trained with another model "
                                    f"({record.get('name')}): its weights do not fit "
                                    f"{source.name} ({str(err).splitlines()[0]}).") from None
    return Predictor(net, {**meta, "model": {**record, "kind": source.kind
                                             if record.get("kind") != "zoo" else "zoo"}})
