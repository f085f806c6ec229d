"""ngra.models: the model zoo, each layer a SAGA program; link decoders (:mod:`.decoders`)."""

from ngra.models.commnet import CommNetConv
from ngra.models.decoders import DistMultDecoder, DotDecoder, HadamardMLPDecoder
from ngra.models.gat import GATConv
from ngra.models.gcn import GCNConv
from ngra.models.ggcn import GGCNConv
from ngra.models.ggnn import GGNNConv
from ngra.models.gin import GINConv
from ngra.models.mpnn import MPNNConv
from ngra.models.readout import AttentionPool, MaxPool, MeanPool, SumPool, readout
from ngra.models.rgcn import RGCNConv
from ngra.models.sage import SAGEConv
from ngra.models.zoo import (
    GNN,
    HYPER_PARAMETERS,
    MODELS,
    Defaults,
    Hyper,
    ModelSpec,
    build_model,
    defaults_table,
    hyper_parameters,
    param_groups,
    prepare,
    relation_norm,
)

__all__ = [
    "GCNConv", "SAGEConv", "GATConv", "GINConv", "GGCNConv", "CommNetConv", "GGNNConv",
    "RGCNConv", "MPNNConv", "GNN", "MODELS", "ModelSpec", "Defaults", "Hyper", "HYPER_PARAMETERS",
    "build_model", "defaults_table", "hyper_parameters", "param_groups", "prepare",
    "relation_norm", "SumPool", "MeanPool", "MaxPool", "AttentionPool", "readout",
    "DotDecoder", "HadamardMLPDecoder", "DistMultDecoder",
]
