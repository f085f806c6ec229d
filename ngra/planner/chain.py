"""The planner's input: a chain (or DAG) of dense layers over a batch of rows.

A :class:`Chain` lists its layers in a topological order; each :class:`Layer` says
what one row costs (widths, parameters, what autograd keeps) and which
tensor-parallel splits the runtime can run on it. Rows are samples of an MLP batch
or the vertices of a graph; a ``"graph"`` layer is a GNN's Scatter-ApplyEdge-Gather,
which reads other rows (the in-edges' sources) and so, split over ``d`` ranks by
rows, receives the halo rows of the graph's ``d``-way partition
(:attr:`Chain.halo`). Chains come from :func:`ngra.planner.trace_module` (a
``torch.nn.Module`` through torch.fx) or :func:`ngra.planner.gnn_chain` (a GNN's
compiled vertex-side stages), or are written by hand.

A DAG is planned over its topological order: a pipeline cut between positions
``j - 1`` and ``j`` sends every tensor made before ``j`` and read at or after it
(:meth:`Chain.cut_width`). Under tensor parallelism a tensor read by any layer but
the next one stays whole (replicated), and a layer that reads anything but the
previous layer's output reads whole tensors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

__all__ = ["Layer", "Chain", "KINDS", "SPLITS"]

#: layer kinds: a Linear; a row-wise unary op (works on a column shard too); any other
#: row-wise op (needs whole rows: add of two tensors, cat, norms, GAT's rowdot); a GNN
#: graph stage (reads the rows of in-edge sources)
KINDS = ("linear", "elementwise", "other", "graph")
#: tensor-parallel splits a Linear may allow: output columns, input columns
SPLITS = ("col", "row")


@dataclass(frozen=True)
class Layer:
    """One layer of a :class:`Chain`; sizes are per row of the batch.

    Attributes:
        name: a readable name (a module path, or the op and its position).
        kind: one of :data:`KINDS`.
        in_width: input features per row (summed over the inputs of a DAG node).
        out_width: output features per row.
        param_bytes: bytes of the layer's parameters.
        saved_width: float32 features per row that autograd keeps for backward.
        splits: the tensor-parallel splits the runtime can run (a subset of
            :data:`SPLITS`, Linears only); ``()``: the layer is replicated under
            tensor parallelism.
        inputs: indices of the layers it reads, ``-1`` for the chain's input
            (default: the previous layer).
        module: the qualified name of the ``nn.Linear`` the runtime parallelizes
            (``""`` for none).
        edges: graph layers: in-edges aggregated over the whole graph.
        read_width: graph layers: features read per edge (source and destination terms).
        exchange_width: graph layers: features of each source row another rank sends.
        feature_width: graph layers whose edge stage splits by columns (the feature
            layout, :mod:`ngra.distributed.feature`): the columns (heads) it splits, so at
            most that many ranks; 0: it does not split.
    """

    name: str
    kind: str
    in_width: int
    out_width: int
    param_bytes: int = 0
    saved_width: int = 0
    splits: tuple[str, ...] = ()
    inputs: tuple[int, ...] | None = None
    module: str = ""
    edges: int = 0
    read_width: int = 0
    exchange_width: int = 0
    feature_width: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"layer {self.name!r}: kind must be one of {KINDS}; "
                             f"got {self.kind!r}.")
        if self.in_width < 1 or self.out_width < 1:
            raise ValueError(f"layer {self.name!r}: widths must be >= 1; got in_width="
                             f"{self.in_width}, out_width={self.out_width}.")
        bad = [s for s in self.splits if s not in SPLITS]
        if bad or (self.splits and self.kind != "linear"):
            raise ValueError(f"layer {self.name!r}: splits must be a subset of {SPLITS} on a "
                             f"linear layer; got {self.splits!r} on a {self.kind} layer.")
        if min(self.param_bytes, self.saved_width, self.edges, self.read_width,
               self.exchange_width, self.feature_width) < 0:
            raise ValueError(f"layer {self.name!r}: sizes must be >= 0.")


@dataclass(frozen=True)
class Chain:
    """A chain (or DAG, in topological order) of dense layers over ``rows`` rows.

    Attributes:
        name: what the chain is (for tables and JSON).
        layers: the layers, each reading only earlier ones.
        rows: the global batch: samples, or the graph's vertices.
        input_width: features per row of the chain's input.
        halo: ``((parts, rows), ...)``: for a ``parts``-way row partition, the source
            rows the busiest rank receives before a graph layer (the partition book's
            halo); needed for every data-parallel degree > 1 of a chain with graph layers.
    """

    name: str
    layers: tuple[Layer, ...]
    rows: int
    input_width: int
    halo: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "halo", tuple((int(p), int(r)) for p, r in self.halo))
        if not self.layers:
            raise ValueError(f"chain {self.name!r} has no layers.")
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 1:
            raise ValueError(f"chain {self.name!r}: rows must be an int >= 1; got {self.rows!r}.")
        if self.input_width < 1:
            raise ValueError(f"chain {self.name!r}: input_width must be >= 1.")
        for i, layer in enumerate(self.layers):
            bad = [j for j in self.inputs(i) if not -1 <= j < i]
            if bad:
                raise ValueError(f"chain {self.name!r}: layer {i} ({layer.name}) reads "
                                 f"{bad}; a layer reads only earlier layers (or -1, the input).")

    # ------------------------------------------------------------ structure
    def __len__(self) -> int:
        return len(self.layers)

    def inputs(self, i: int) -> tuple[int, ...]:
        """Indices layer ``i`` reads (``-1``: the chain's input)."""
        ins = self.layers[i].inputs
        return (i - 1,) if ins is None else ins

    @cached_property
    def readers(self) -> dict[int, tuple[int, ...]]:
        """``producer index (-1: input) -> indices of the layers reading it``."""
        out: dict[int, list[int]] = {j: [] for j in range(-1, len(self.layers))}
        for i in range(len(self.layers)):
            for j in self.inputs(i):
                out[j].append(i)
        return {j: tuple(r) for j, r in out.items()}

    def width_of(self, j: int) -> int:
        """Features per row of tensor ``j`` (``-1``: the chain's input)."""
        return self.input_width if j < 0 else self.layers[j].out_width

    def cut_width(self, j: int) -> int:
        """Features per row that cross a pipeline cut before layer ``j`` (``0 < j < len``):
        every tensor made before ``j`` and read at or after it."""
        return sum(self.width_of(p) for p in range(-1, j)
                   if any(r >= j for r in self.readers[p]))

    def chained(self, i: int) -> bool:
        """Layer ``i`` reads only the previous layer's output, which nothing else reads:
        a column split may pass from ``i - 1`` to ``i``."""
        return self.inputs(i) == (i - 1,) and (i == 0 or self.readers[i - 1] == (i,))

    @cached_property
    def grad_flows(self) -> tuple[bool, ...]:
        """Per layer: whether the gradient of its input is needed (some parameter
        upstream of it), i.e. whether its backward computes an input gradient."""
        upstream = {-1: False}
        out = []
        for i, layer in enumerate(self.layers):
            ins = self.inputs(i)
            out.append(any(upstream[j] for j in ins))
            upstream[i] = layer.param_bytes > 0 or out[-1]
        return tuple(out)

    @property
    def rows_independent(self) -> bool:
        """No graph layer: rows can be split into micro-batches and pipelined."""
        return all(layer.kind != "graph" for layer in self.layers)

    def halo_rows(self, parts: int) -> int:
        """Rows the busiest of ``parts`` ranks receives before each graph layer."""
        if parts <= 1 or self.rows_independent:
            return 0
        for p, r in self.halo:
            if p == parts:
                return r
        raise ValueError(f"chain {self.name!r} has graph layers but no halo size for a "
                         f"{parts}-way partition (halo given for {[p for p, _ in self.halo]}).")

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rows": self.rows, "input_width": self.input_width,
                "halo": [list(h) for h in self.halo],
                "layers": [asdict(layer) for layer in self.layers]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Chain:
        layers = []
        for spec in d["layers"]:
            spec = dict(spec)
            spec["splits"] = tuple(spec.get("splits", ()))
            if spec.get("inputs") is not None:
                spec["inputs"] = tuple(spec["inputs"])
            layers.append(Layer(**spec))
        return cls(str(d["name"]), tuple(layers), int(d["rows"]), int(d["input_width"]),
                   tuple(tuple(h) for h in d.get("halo", ())))
