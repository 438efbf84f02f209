"""Runs and ranks: the run list, a run by id or name, its data version (the cache key), how far it got."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pandas as pd

from collector.data import layout
from collector.data.queries.connection import Catalog


def list_runs(cat: Catalog) -> pd.DataFrame:
    """Every run, newest first, with its duration so far."""
    return cat.df(
        """
        SELECT run_id, name, status, world_size, n_ranks, started_at, ended_at,
               epoch(coalesce(ended_at::TIMESTAMPTZ, now()) - started_at::TIMESTAMPTZ) AS duration_s,
               source, linked_run_id, config
        FROM runs ORDER BY started_at DESC, run_id""",
        [],
    )


def runs_with(data_dir, table: str) -> set[str]:
    """The runs that have at least one committed segment of ``table`` (a directory listing,
    not a scan: cheap on any data dir)."""
    return {
        layout.run_of(p)
        for p in layout.partitions(Path(data_dir), table)
        if not layout.is_shared(p) and any(p.glob(f"*{layout.SEGMENT_SUFFIX}"))
    }


class UnknownRun(LookupError):
    """No run has that id or name."""


def resolve_run(con, run: str) -> str:
    """The run id of ``run``: a run id, or a run name (the newest run of that name).
    ``con`` is a catalog connection or cursor."""
    rows = con.execute(
        "SELECT run_id FROM runs WHERE run_id = ? OR name = ? ORDER BY (run_id = ?) DESC, started_at DESC",
        [run, run, run],
    ).fetchall()
    if not rows:
        raise UnknownRun(f"no run with id or name {run!r}")
    return rows[0][0]


def data_version(data_dir: str, run_id: str) -> str:
    """Fingerprint of every committed segment of ``run_id`` (any table)."""
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise ValueError(f"not a run id: {run_id!r}")
    digest = hashlib.sha1()
    root = Path(data_dir)
    for table in layout.stored_schemas():
        part = layout.partition_dir(root, table, run_id)
        if not part.is_dir():
            continue
        for entry in sorted(os.scandir(part), key=lambda e: e.name):
            if entry.name.endswith(layout.SEGMENT_SUFFIX) and not entry.name.startswith("."):
                st_ = entry.stat()
                digest.update(f"{table}/{entry.name}:{st_.st_size}:{st_.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def latest_step(cat: Catalog, run_id: str) -> int | None:
    """The highest step any rank has reported in comm or timers (Parquet min/max stats make it cheap)."""
    value = cat.df(
        """
        SELECT max(step) AS step FROM (
            SELECT max(step) AS step FROM comm WHERE run_id = ?
            UNION ALL SELECT max(step) FROM timers WHERE run_id = ?)""",
        [run_id, run_id],
    ).step.iloc[0]
    return None if pd.isna(value) else int(value)


def ranks(cat: Catalog, run_id: str) -> pd.DataFrame:
    return cat.df(
        """
        SELECT rank, host, pid, status, ended_at, dropped_records
        FROM ranks WHERE run_id = ? ORDER BY rank""",
        [run_id],
    )


def deliveries(cat: Catalog, run_id: str) -> pd.DataFrame:
    """When each of the run's telemetry envelopes was made and reached the collector
    (collector.data.deliveries): rank, step, made_ns, received_ns."""
    return cat.df("SELECT rank, step, made_ns, received_ns FROM deliveries WHERE run_id = ?", [run_id])
