"""``python -m ngra.datasets SPEC [SPEC ...]``: load datasets, report sizes and load times.

Loads each spec (twice with ``--repeat 2`` to time a cache hit) and prints one
JSON line per load. Useful to pre-build the cache for large synthetic graphs and
to measure loaders, e.g.::

    python -m ngra.datasets --repeat 2 rmat:scale=20 twitter
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from . import describe, load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ngra.datasets",
        description="Load ngra datasets and report their sizes and load times.",
        epilog="Specs:\n" + describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "specs", nargs="+", metavar="SPEC", help="dataset spec, e.g. cora or rmat:scale=18"
    )
    parser.add_argument(
        "--data-root", default=None, help="data folder (default: $NGRA_DATA or ~/.ngra/data)"
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="neither read nor write the dataset cache"
    )
    parser.add_argument(
        "--no-download", action="store_true", help="fail instead of downloading missing files"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="loads per spec (2 times a cache hit)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    for spec in args.specs:
        for i in range(args.repeat):
            t0 = time.perf_counter()
            ds = load(
                spec, root=args.data_root, cache=not args.no_cache, download=not args.no_download
            )
            seconds = time.perf_counter() - t0
            record = {
                **ds.summary(),
                "spec": ds.info.get("spec"),
                "cache": ds.info.get("cache"),
                "load_s": round(seconds, 3),
                "run": i + 1,
            }
            print(json.dumps(record), flush=True)
            del ds
    return 0


if __name__ == "__main__":
    sys.exit(main())
