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


def run_info(cat: Catalog, run_id: str) -> dict | None:
    """The run's first Hello (world_size, source, config: what ``runs`` takes from it), without judging
    every run's status as ``list_runs`` does; None for a run no rank said Hello of."""
    rows = cat.df(
        "SELECT world_size, source, config FROM _runs_raw WHERE run_id = ? ORDER BY started_at LIMIT 1", [run_id]
    )
    return rows.iloc[0].to_dict() if len(rows) else None


class UnknownRun(LookupError):
    """No run has that id or name."""


class AmbiguousRun(UnknownRun):
    """A run name several runs share, none of them the one still running; ``matches`` holds their
    ids, newest first, and the message lists them with how to name one."""

    def __init__(self, message: str, matches: list[str]):
        super().__init__(message)
        self.matches = matches


MAX_LISTED = 8  # matches an ambiguity message names; it counts the rest


def pick_run(run: str, rows) -> str:
    """The run ``run`` names, among ``rows`` of (run_id, name, status, started_at), newest first,
    as every command and the dashboard's ``?run=`` take it: a run id; else a run name that one run
    has; else, of several runs of that name, the only one still running. Otherwise raises
    UnknownRun, or AmbiguousRun listing the matches (no silent "newest wins")."""
    named = []
    for row in rows:
        if row[0] == run:
            return run
        if row[1] == run:
            named.append(row)
    if not named:
        raise UnknownRun(f"no run with id or name {run!r}")
    if len(named) == 1:
        return named[0][0]
    running = [row for row in named if row[2] == "running"]
    if len(running) == 1:
        return running[0][0]
    listed = "; ".join(f"{row[0]} ({row[2]}, started {_when(row[3])})" for row in named[:MAX_LISTED])
    more = f"; and {len(named) - MAX_LISTED} more" if len(named) > MAX_LISTED else ""
    raise AmbiguousRun(
        f"{len(named)} runs are named {run!r}{' (none of them the one running)' if not running else ''}: "
        f"{listed}{more}. Name one by its run id",
        [row[0] for row in named],
    )


def _when(started) -> str:
    try:
        return pd.Timestamp(started).strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, TypeError):
        return str(started)


def resolve_run(con, run: str) -> str:
    """The run id of ``run`` (``pick_run``'s rule). ``con`` is a catalog connection or cursor."""
    # The Hellos alone settle a run id and a name one run has; judging every run's status (the
    # ``runs`` view) is for a name several runs share.
    hellos = con.execute("SELECT run_id FROM _runs_raw WHERE run_id = ? OR name = ?", [run, run]).fetchall()
    said_hello = {row[0] for row in hellos}
    if run in said_hello:
        return run
    if len(said_hello) == 1:
        return said_hello.pop()
    rows = con.execute(
        "SELECT run_id, name, status, started_at FROM runs WHERE run_id = ? OR name = ? ORDER BY started_at DESC",
        [run, run],
    ).fetchall()
    return pick_run(run, rows)


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


def probes(cat: Catalog, run_id: str) -> pd.DataFrame:
    """The run's link probes (collector.server.probe): one row per rank's answer."""
    columns = "rank step request_id status host peer_rank peer_host direction mbit_s time_ns".split()
    if not cat.has_rows("probes", run_id):  # most runs were never probed
        return pd.DataFrame(columns=columns)
    return cat.df(f"SELECT {', '.join(columns)} FROM probes WHERE run_id = ? ORDER BY time_ns", [run_id])


def deliveries(cat: Catalog, run_id: str) -> pd.DataFrame:
    """When each of the run's telemetry envelopes was made and reached the collector
    (collector.data.deliveries): rank, step, made_ns, received_ns."""
    return cat.df("SELECT rank, step, made_ns, received_ns FROM deliveries WHERE run_id = ?", [run_id])
