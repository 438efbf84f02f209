"""``rankscope export``'s statements (collector.tools.export writes the files). They run on a
``catalog.connect`` connection, with the run as the ``$run`` (or ``?``) parameter."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from collector.data.schema import TABLES
from collector.data.views import quote_ident

# -- perfetto: DuckDB writes each event's JSON itself (~5x faster than json.dumps per row) -----

_TIMED = "run_id = $run AND start_ns IS NOT NULL AND end_ns IS NOT NULL"
# a track (Perfetto thread) per rank and communication group, numbered from 1 (0: the engine timers)
_TRACKS = f"""tracks AS (
    SELECT rank, g, row_number() OVER (PARTITION BY rank ORDER BY g) AS tid
    FROM (SELECT DISTINCT rank, coalesce(group_name, '') AS g FROM comm WHERE {_TIMED}))"""
_COMM_EVENTS = f"""WITH {_TRACKS}
    SELECT json_object('name', coalesce(log_name, op), 'cat', 'comm', 'ph', 'X', 'pid', c.rank, 'tid', t.tid,
                       'ts', (start_ns - $t0) / 1e3, 'dur', greatest(end_ns - start_ns, 0) / 1e3,
                       'args', json_object('op', op, 'seq', seq, 'step', step, 'bytes', bytes,
                                           'algbw_gbs', algbw_gbs, 'busbw_gbs', busbw_gbs, 'dtype', dtype,
                                           'numel', numel, 'group_size', group_size))::VARCHAR
    FROM comm c JOIN tracks t ON t.rank = c.rank AND t.g = coalesce(c.group_name, '')
    WHERE {_TIMED} ORDER BY start_ns, c.rank"""
_TIMER_EVENTS = """
    SELECT json_object('name', name, 'cat', 'timer', 'ph', 'X', 'pid', rank, 'tid', 0,
                       'ts', (start_ns - $t0) / 1e3, 'dur', greatest(coalesce(dur_ns, 0), 0) / 1e3,
                       'args', json_object('step', step))::VARCHAR
    FROM timers WHERE run_id = $run AND start_ns IS NOT NULL ORDER BY start_ns, rank"""


def trace_extent(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple:
    """(t0: the run's first comm or timer start_ns or None, comm rows, comm rows with times,
    timer rows with a start)."""
    return con.execute(
        f"""SELECT least((SELECT min(start_ns) FROM comm WHERE {_TIMED}),
                         (SELECT min(start_ns) FROM timers WHERE run_id = $run)),
                   (SELECT count(*) FROM comm WHERE run_id = $run),
                   (SELECT count(*) FROM comm WHERE {_TIMED}),
                   (SELECT count(start_ns) FROM timers WHERE run_id = $run)""",
        {"run": run_id},
    ).fetchall()[0]


def trace_tracks(con: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple[int, str, int]]:
    """(rank, group name or '', tid) of every comm track."""
    return con.execute(f"WITH {_TRACKS} SELECT rank, g, tid FROM tracks ORDER BY rank, tid", {"run": run_id}).fetchall()


def trace_ranks(con: duckdb.DuckDBPyConnection, run_id: str) -> set[int]:
    """The ranks that said Hello or sent timers."""
    params = {"run": run_id}
    return {r for (r,) in con.execute("SELECT rank FROM ranks WHERE run_id = $run", params).fetchall()} | {
        r for (r,) in con.execute("SELECT DISTINCT rank FROM timers WHERE run_id = $run", params).fetchall()
    }


def comm_events(con: duckdb.DuckDBPyConnection, run_id: str, t0: int, batch: int) -> pa.RecordBatchReader:
    """One JSON trace event per timed comm row (times relative to ``t0``), in time order."""
    return con.sql(_COMM_EVENTS, params={"run": run_id, "t0": t0}).to_arrow_reader(batch)


def timer_events(con: duckdb.DuckDBPyConnection, run_id: str, t0: int, batch: int) -> pa.RecordBatchReader:
    """One JSON trace event per timer row with a start (times relative to ``t0``), in time order."""
    return con.sql(_TIMER_EVENTS, params={"run": run_id, "t0": t0}).to_arrow_reader(batch)


# -- archive and parquet ------------------------------------------------------------------


def run_header(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple:
    """(name, world_size, source) of the run."""
    (row,) = con.execute("SELECT name, world_size, source FROM runs WHERE run_id = ?", [run_id]).fetchall()
    return row


def table_rows(con: duckdb.DuckDBPyConnection, table: str, run_id: str, batch: int) -> pa.RecordBatchReader:
    """Every row of the run in ``table``: a stored table, or one of the collector's (runs, ranks,
    rank_ends: their raw rows, every Hello and RunEnd as sent)."""
    view = table if table in TABLES else f"_{table}_raw"
    return con.sql(f"SELECT * FROM {quote_ident(view)} WHERE run_id = ?", params=[run_id]).to_arrow_reader(batch)


# -- Flight Recorder -------------------------------------------------------------------

# Each completed collective (comm) and each still open (inflight_open), p2p left out, per rank in time order.
_FR_ROWS = """
    SELECT rank, group_name, group_size, seq, op, dtype, numel, start_ns, end_ns, 'completed' AS state
    FROM comm WHERE run_id = $run AND seq IS NOT NULL AND NOT starts_with(group_name, 'p2p[')
    UNION ALL
    SELECT rank, group_name, group_size, seq, op, dtype, numel, entered_ns, NULL, 'started'
    FROM inflight_open WHERE run_id = $run AND NOT starts_with(group_name, 'p2p[')
    ORDER BY rank, start_ns NULLS LAST, group_name, seq"""


def flight_recorder_rows(con: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple]:
    """(rank, group_name, group_size, seq, op, dtype, numel, start_ns, end_ns, state) per collective."""
    return con.execute(_FR_ROWS, {"run": run_id}).fetchall()
