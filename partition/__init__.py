"""ngra.partition: vertex reordering, k-way partitioning, 2-D tiling and the grid choice.

The pipeline the compiler and runtime use::

    r = reorder(graph, "rcm")                       # locality (optional)
    g = permute_graph(graph, r)                     # perm still indexes original edges
    choice = choose_grid(g, TileBytes(...), "2GB")   # smallest P x Q that fits
    grid = choice.grid                              # or tile_graph(g, dst_bounds=..., src_bounds=...)
    for p in range(grid.num_dst_parts):             # forward: columns, accumulator resident
        for tile in grid.column(p): ...

    book = build_book(graph, 4, "metis")            # multi-device: owners, ranges, halos

See :mod:`ngra.partition.tiling` for the tile index conventions.
"""

from ngra.partition.book import (
    BOOK_METHODS,
    BOOK_SEED,
    BookError,
    PartitionBook,
    book_for,
    build_book,
    check_book,
    load_book,
    save_book,
)
from ngra.partition.grid_choice import (
    GridChoice,
    TileBytes,
    choose_grid,
    cost_bounds,
    format_bytes,
    grid_peak_bytes,
    parse_bytes,
)
from ngra.partition.kway import (
    cost_balanced_ranges,
    degree_indptr,
    edge_balanced_ranges,
    interval_of,
    metis_parts,
    refine_ranges,
    symmetric_adjacency,
)
from ngra.partition.reorder import (
    REORDER_METHODS,
    Reordering,
    permute_graph,
    permute_rows,
    relabel,
    reorder,
    reorder_dataset,
    unpermute_rows,
)
from ngra.partition.tiling import Summary, Tile, TileGrid, TileStats, default_bounds, tile_graph

__all__ = [
    # book
    "BOOK_METHODS",
    "BOOK_SEED",
    "book_for",
    "BookError",
    "PartitionBook",
    "build_book",
    "check_book",
    "load_book",
    "save_book",
    # reorder
    "REORDER_METHODS",
    "Reordering",
    "reorder",
    "reorder_dataset",
    "permute_graph",
    "permute_rows",
    "unpermute_rows",
    "relabel",
    # kway
    "metis_parts",
    "symmetric_adjacency",
    "edge_balanced_ranges",
    "cost_balanced_ranges",
    "refine_ranges",
    "degree_indptr",
    "interval_of",
    # tiling
    "Tile",
    "TileGrid",
    "TileStats",
    "Summary",
    "tile_graph",
    "default_bounds",
    # budget
    "TileBytes",
    "GridChoice",
    "choose_grid",
    "cost_bounds",
    "grid_peak_bytes",
    "parse_bytes",
    "format_bytes",
]
