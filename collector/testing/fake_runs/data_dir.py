"""A fake run into a data dir: its Parquet files in the collector's layout (the stored schemas,
one runs/ranks row per Hello, rank_ends once a rank has ended) and the catalog over them."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collector.data import layout
from collector.data.catalog import ensure_catalog
from collector.data.schema import RANK_ENDS_SCHEMA, RANKS_SCHEMA, RUNS_SCHEMA
from collector.testing.fake_runs.story import FakeRun


def _write(data_dir: Path, table: str, run_id: str, segment: str, rows: pa.Table) -> None:
    path = layout.partition_dir(data_dir, table, run_id) / f"fake-{segment}{layout.SEGMENT_SUFFIX}"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = layout.temp_name(path)  # renamed into place, as the collector does: readers never see half a file
    pq.write_table(rows, tmp)
    tmp.rename(path)


def _write_rows(data_dir: Path, table: str, run_id: str, segment: str, rows: list[dict], schema: pa.Schema) -> None:
    _write(data_dir, table, run_id, segment, pa.Table.from_pylist(rows, schema=schema))


def write_run(data_dir, run: FakeRun, steps_per_segment: int = 50) -> None:
    """One run's Parquet files (not the catalog): comm per rank in segments of
    ``steps_per_segment`` steps, every other table in one segment."""
    data_dir = Path(data_dir)
    per_rank = []
    for r in range(run.world_size):
        for first, n in run.comm_chunks(steps_per_segment):
            _write(data_dir, "comm", run.run_id, f"rank{r}-{first:09d}", run.comm_arrow(r, first, n))
        per_rank.append(run.other_tables(r))
    for table in per_rank[0]:
        _write(data_dir, table, run.run_id, "all-ranks", pa.concat_tables([tables[table] for tables in per_rank]))
    hellos = [run.hello(r) for r in range(run.world_size)]
    started = run.start
    runs = [
        dict(
            run_id=run.run_id,
            name=h.run_name,
            world_size=h.world_size,
            started_at=started,
            source=h.source,
            linked_run_id=None,
            config=h.config_json,
        )
        for h in hellos
    ]
    _write_rows(data_dir, "runs", run.run_id, "hello", runs, RUNS_SCHEMA)
    ranks = [
        dict(
            run_id=run.run_id,
            rank=h.rank,
            host=h.host,
            pid=h.pid,
            clock_offset_ns=h.clock_offset_ns,
            client_id=run.client_id(h.rank),
            started_at=started,
        )
        for h in hellos
    ]
    _write_rows(data_dir, "ranks", run.run_id, "hello", ranks, RANKS_SCHEMA)
    if run.status != "running":
        ends = [
            dict(run_id=run.run_id, rank=r, status=run.status, ended_at=run.end, dropped_records=0, ended_by="rank")
            for r in range(run.world_size)
        ]
        _write_rows(data_dir, "rank_ends", run.run_id, "end", ends, RANK_ENDS_SCHEMA)


def write_data_dir(data_dir, *runs: FakeRun, steps_per_segment: int = 50) -> Path:
    """A data dir holding ``runs`` and the catalog over them; returns its path."""
    data_dir = Path(data_dir)
    for run in runs:
        write_run(data_dir, run, steps_per_segment)
    ensure_catalog(data_dir)
    return data_dir
