"""ngra.datasets: node-classification datasets for ngra.

One entry point, :func:`load`, takes a spec string usable from the command line::

    ds = ngra.datasets.load("cora")                          # Planetoid, public split
    ds = ngra.datasets.load("rmat:scale=18,feat=64,seed=0")  # synthetic, cached on disk
    ds.graph, ds.x, ds.y, ds.train_mask                      # ngra.Graph and tensors

Loaders: Planetoid raw files (:func:`load_planetoid`), OGB node-property folders
(:func:`load_ogb`), edge lists (:func:`load_edgelist`, :func:`load_twitter`),
generators (:func:`rmat`, :func:`sbm`); an edge list with the user's own features,
labels and split (``edgelist:g.csv,features=x.npy,labels=y.csv,split=s.npz``, see
:mod:`~ngra.datasets.vertexdata`); interop with PyG and DGL
(:func:`to_pyg`, :func:`from_pyg`, :func:`to_dgl`, :func:`from_dgl`).
:func:`check_trainable` says whether training on a dataset can mean anything.

Link prediction: :func:`split_edges` holds out val/test pairs (a :class:`LinkSplit`),
:func:`load_ogb_link` reads an OGB link-property folder in CSV form, and
:func:`sample_negatives` draws each epoch's negative pairs (the same set on any number
of processes).

Graph classification: a :class:`GraphDataset` of many small graphs from a TU folder
(:func:`load_tu`, ``tu:PATH``), an OGB graph-property folder (:func:`load_ogb_graph`,
``ogbg:PATH``, with its split) or a list of PyG ``Data`` (:func:`from_pyg_list`), batched
by a :class:`GraphLoader`.
"""

from .batching import GraphBatch, GraphLoader, collate
from .base import (
    DATA_ENV,
    DamagedFileError,
    DatasetError,
    DatasetNotFoundError,
    MissingFileError,
    NodeDataset,
    SpecError,
    data_root,
)
from .cache import CACHE_ENV
from .convert import from_dgl, from_pyg, to_dgl, to_pyg
from .download import DownloadError
from .graphs import GraphDataset, from_pyg_list
from .edgelist import load_edgelist, load_twitter, read_edgelist
from .linksplit import LinkSplit, split_edges
from .negatives import degree_weights, sample_negatives
from .ogb import load_ogb
from .ogbgraph import load_ogb_graph
from .ogblink import load_ogb_link
from .planetoid import load_planetoid
from .spec import DatasetSpec, available, describe, load, parse_spec
from .synthetic import rmat, sbm, structural_labels
from .trainable import check_trainable
from .tu import load_tu

__all__ = [
    "CACHE_ENV",
    "DATA_ENV",
    "DamagedFileError",
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetSpec",
    "DownloadError",
    "GraphBatch",
    "GraphDataset",
    "GraphLoader",
    "LinkSplit",
    "MissingFileError",
    "NodeDataset",
    "SpecError",
    "available",
    "check_trainable",
    "collate",
    "data_root",
    "degree_weights",
    "describe",
    "from_dgl",
    "from_pyg",
    "from_pyg_list",
    "load",
    "load_edgelist",
    "load_ogb",
    "load_ogb_graph",
    "load_ogb_link",
    "load_planetoid",
    "load_tu",
    "load_twitter",
    "parse_spec",
    "read_edgelist",
    "rmat",
    "sample_negatives",
    "sbm",
    "split_edges",
    "structural_labels",
    "to_dgl",
    "to_pyg",
]
