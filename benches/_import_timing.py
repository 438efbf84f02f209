"""What the import benches time, the same way for every format: the files loaded alone (the floor),
parsed as `rankscope import` parses them, and imported into a fresh data dir, durable; best of N."""

from __future__ import annotations

import time
from pathlib import Path


def time_import(folder: Path, load_one, rounds: int, scratch: Path, run_prefix: str):
    """(best seconds per stage {"load", "parse", "import"}, the last round's parse) for the files in
    ``folder``; ``load_one(path)`` reads one file the format's cheapest way (json.load, pickle)."""
    from collector.tools.importers.dispatch import parse_path
    from collector.tools.importers.ingest import import_path
    from collector.tools.importers.sink import StoreSink

    best = {"load": float("inf"), "parse": float("inf"), "import": float("inf")}
    parsed = None
    for i in range(rounds):
        t0 = time.perf_counter()
        for f in folder.iterdir():
            load_one(f)
        best["load"] = min(best["load"], time.perf_counter() - t0)
        t0 = time.perf_counter()
        parsed = parse_path(folder).parsed
        best["parse"] = min(best["parse"], time.perf_counter() - t0)
        t0 = time.perf_counter()
        with StoreSink(scratch / f"data{i}") as sink:
            import_path(folder, sink=sink, run=f"{run_prefix}-{i}")
        best["import"] = min(best["import"], time.perf_counter() - t0)
    return best, parsed
