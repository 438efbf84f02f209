"""``rankscope replay PATH``: stream an archived run through a live collector again.

PATH is an archive (``rankscope export --archive``), a data dir with ``--run``,
or a ``run=<id>`` partition folder inside a data dir. The run is re-sent as a
new run (new run id, ``source = 'replay'``, ``Hello.linked_run_id`` = the
original) with every row as stored: only run_id and what the collector stamps
on arrival (client ids) differ, so the replay's tables equal the original's row
for row.

Pacing: one stream per rank, as the ranks sent them. Each row has a time --
``start_ns`` (comm, timers) or ``time_ns`` (monitor, loss_scale, memory); rows
without one (flops, moe) take the first time of their rank and step -- and rows
are sent in windows of ``WINDOW_NS`` of original time, each at
``start + (t - t0) / speed`` of wall time, so ``--speed 10`` replays a minute in
six seconds and ``--speed 0`` sends as fast as the collector takes it.

Memory: each rank's rows are read a step range of about CHUNK_ROWS rows at a
time (the step column has Parquet statistics, so each read touches only its
row groups), while the ranks stream in parallel; a run of any length replays in
about ranks x CHUNK_ROWS rows of memory.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from collector.data import catalog, layout
from collector.data.layout import new_run_id
from collector.data.schema import TABLES
from collector.tools.export import ExportError, is_archive, resolve_run, unpack_archive
from collector.tools.importers.sink import GrpcSink, SinkError, client_id, envelope, table_batches
from proto import pb

WINDOW_NS = 50_000_000  # rows of 50 ms of original time travel together
TIME_COLUMNS = ("start_ns", "time_ns")


CHUNK_ROWS = 200_000  # a rank's rows are read a step range at a time, about this many together


@dataclass
class RankData:
    rank: int
    hello: pb.Hello
    end: pb.RunEnd | None
    step_ranges: list[tuple[int | None, int | None]]  # (first, last) step of each chunk; (None, None): no step
    rows: int


def _pace(table: pa.Table, step_times: dict[int, int], default: int) -> np.ndarray:
    col = next((c for c in TIME_COLUMNS if c in table.column_names), None)
    pace = np.array(pc.fill_null(table[col], -1).to_numpy()) if col else np.full(table.num_rows, -1, dtype=np.int64)
    if (pace < 0).any():
        steps = table["step"].to_pylist()
        for i in np.flatnonzero(pace < 0):
            pace[i] = step_times.get(steps[i], default)
    return pace


def _rows_per_step(con, run_id: str) -> dict[int, list[tuple[int | None, int, int | None]]]:
    """Per rank, (step, rows, first time) over every table, in step order (no step first): one pass
    over the run that also tells which ranks have rows and where the run's time starts."""

    def time_of(spec) -> str:
        return next((c for c in TIME_COLUMNS if c in dict(spec.columns)), "NULL")

    union = " UNION ALL ".join(
        f"SELECT rank, step, {time_of(spec)} AS t FROM {catalog.quote_ident(t)} WHERE run_id = ?"
        for t, spec in TABLES.items()
    )
    out: dict[int, list] = {}
    for rank, step, n, first in con.execute(
        f"SELECT rank, step, count(*), min(t) FROM ({union}) GROUP BY rank, step ORDER BY rank, step NULLS FIRST",
        [run_id] * len(TABLES),
    ).fetchall():
        out.setdefault(rank, []).append((step, n, first))
    return out


def _step_ranges(per_step: list[tuple[int | None, int, int | None]]) -> list[tuple[int | None, int | None]]:
    """Consecutive steps grouped into chunks of about CHUNK_ROWS rows (at least one step each)."""
    ranges, first, last, rows = [], None, None, 0
    for step, n, _ in per_step:
        if step is None:
            ranges.append((None, None))
            continue
        if first is not None and rows + n > CHUNK_ROWS:
            ranges.append((first, last))
            first, rows = None, 0
        first = step if first is None else first
        last, rows = step, rows + n
    if first is not None:
        ranges.append((first, last))
    return ranges


def open_run(con, run: str) -> tuple[dict, list[RankData]]:
    """The run's catalog rows and, per rank, how to read its rows in bounded chunks (rank_stream
    reads them through ``con``); nothing but per-step row counts is loaded here."""
    run_id = resolve_run(con, run)
    cols = ["name", "world_size", "config", "started_ns", "source", "linked_run_id"]
    run_row = dict(
        zip(
            cols,
            con.execute(
                "SELECT name, world_size, config, epoch_ns(started_at), source, "
                "linked_run_id FROM runs WHERE run_id = ?",
                [run_id],
            ).fetchall()[0],
            strict=True,
        )
    )
    run_row["run_id"] = run_id
    hellos = {
        r[0]: r[1:]
        for r in con.execute(
            """SELECT rank, host, pid, clock_offset_ns, epoch_ns(started_at) FROM ranks WHERE run_id = ?""", [run_id]
        ).fetchall()
    }
    ends = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT rank, status, epoch_ns(ended_at), dropped_records, coalesce(ended_by, 'rank') FROM rank_ends "
            "WHERE run_id = ?",
            [run_id],
        ).fetchall()
    }
    per_rank = _rows_per_step(con, run_id)
    run_row["first_ns"] = min((t for steps in per_rank.values() for _, _, t in steps if t is not None), default=0)
    run_start = run_row["started_ns"] or 0
    out = []
    for rank in sorted(set(hellos) | set(per_rank)):
        host, pid, offset, started = hellos.get(rank, (None, 0, 0, run_start))
        hello = pb.Hello(
            run_name=run_row["name"] or "",
            rank=rank,
            world_size=run_row["world_size"],
            host=host or "",
            pid=pid or 0,
            clock_offset_ns=offset or 0,
            started_at_ns=started or run_start,
            config_json=run_row["config"] or "",
            source="replay",
            linked_run_id=run_id,
        )
        end = None
        if rank in ends:
            status, ended, dropped, ended_by = ends[rank]
            end = pb.RunEnd(
                rank=rank, status=status, ended_at_ns=ended or 0, dropped_records=dropped or 0, ended_by=ended_by
            )
        per_step = per_rank.get(rank, [])
        out.append(RankData(rank, hello, end, _step_ranges(per_step), sum(n for _, n, _ in per_step)))
    return run_row, out


def _chunks(con, run_id: str, data: RankData):
    """(tables, paces) per step range of the rank: each table's rows sorted by pace, the original
    ns each row is paced by (its start_ns / time_ns, else the first time of its step)."""
    for first, last in data.step_ranges:
        where = "step IS NULL" if first is None else "step BETWEEN ? AND ?"
        params = [run_id, data.rank] + ([] if first is None else [first, last])
        tables = {}
        for t in TABLES:
            sql = f"SELECT * EXCLUDE (run_id) FROM {catalog.quote_ident(t)} WHERE run_id = ? AND rank = ? AND {where}"
            # Replaying into the collector that writes this data dir: its compaction may unlink a
            # segment (of the new run, too) between DuckDB listing the files and reading them.
            rows = catalog.with_segment_retry(lambda q=sql, p=params: con.sql(q, params=p).to_arrow_table())
            if rows.num_rows:
                tables[t] = rows
        step_times: dict[int, int] = {}
        for rows in tables.values():
            col = next((c for c in TIME_COLUMNS if c in rows.column_names), None)
            if col:
                for step, ns in zip(rows["step"].to_pylist(), rows[col].to_pylist()):
                    if ns is not None and (step not in step_times or ns < step_times[step]):
                        step_times[step] = ns
        default = min(step_times.values(), default=data.hello.started_at_ns)
        ordered, paces = {}, {}
        for t, rows in tables.items():
            pace = _pace(rows, step_times, default)
            order = np.argsort(pace, kind="stable")
            ordered[t], paces[t] = rows.take(pa.array(order)), pace[order]
        yield ordered, paces


def rank_stream(
    con,
    data_dir: Path,
    run_id: str,
    data: RankData,
    new_run: str,
    client: str,
    speed: float = 0,
    t0: int = 0,
    wall0: float = 0,
    bar=None,
):
    """The rank's envelopes, read a chunk at a time through a cursor of ``con`` over ``data_dir``,
    each window held back until its time has come (speed 0: no wait)."""
    cursor = catalog.cursor(con, data_dir)  # one per stream: the streams run on their own threads
    try:
        hello = pb.Hello()
        hello.CopyFrom(data.hello)
        hello.run_id = new_run
        seq = 1
        yield envelope(client, seq, hello=hello)
        for tables, paces in _chunks(cursor, run_id, data):
            for batch in _paced(tables, paces, new_run, data.rank, speed, t0, wall0, bar):
                seq += 1
                yield envelope(client, seq, table=batch)
        if data.end is not None:
            end = pb.RunEnd()
            end.CopyFrom(data.end)
            end.run_id = new_run
            seq += 1
            yield envelope(client, seq, end=end)
    finally:
        cursor.close()


def _paced(
    tables: dict[str, pa.Table],
    paces: dict[str, np.ndarray],
    new_run: str,
    rank: int,
    speed: float,
    t0: int,
    wall0: float,
    bar,
):
    """One chunk's rows as TableBatches, in windows of WINDOW_NS of original time, each window
    released at wall0 + (its start - t0) / speed (speed 0: all at once)."""
    window = WINDOW_NS if speed > 0 else None
    lo = min((p[0] for p in paces.values() if len(p)), default=t0)
    cursor = {t: 0 for t in tables}
    while any(cursor[t] < len(paces[t]) for t in tables):
        hi = lo + window if window else None
        if speed > 0:
            delay = wall0 + (lo - t0) / 1e9 / speed - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        for t, rows in tables.items():
            pace = paces[t]
            start = cursor[t]
            end = len(pace) if hi is None else int(np.searchsorted(pace, hi, side="left"))
            if end > start:
                yield from table_batches(t, new_run, rank, rows.slice(start, end - start))
                if bar is not None:
                    bar.update(end - start)
                cursor[t] = end
        if hi is not None:
            remaining = [paces[t][cursor[t]] for t in tables if cursor[t] < len(paces[t])]
            lo = max(hi, min(remaining)) if remaining else hi


def open_source(source: Path, run: str | None, tmp: Path) -> tuple[Path, str]:
    """(data dir, run) for an archive (unpacked into tmp), a partition folder or a data dir."""
    if is_archive(source):
        manifest = unpack_archive(source, tmp)
        return tmp, run or manifest["run_id"]
    if layout.run_of(source) is not None and source.parent.parent.name == layout.PARQUET_DIR:
        return source.parent.parent.parent, run or layout.run_of(source)
    if (source / layout.PARQUET_DIR).is_dir():
        if not run:
            raise ExportError(f"{source} is a data dir: say which run with --run")
        return source, run
    raise ExportError(f"{source}: not an archive, a data dir or a run=<id> folder")


def restore_streams(archive: Path) -> tuple[str, list]:
    """An archive's run under its own run id, as it was sent (watch mode ingests dropped
    archives this way); client ids are derived from the run, so a second restore is a no-op."""
    with tempfile.TemporaryDirectory(prefix="rankscope-restore-") as tmp:
        data_dir, run = open_source(archive, None, Path(tmp))
        con = catalog.connect(data_dir)
        try:
            run_row, ranks = open_run(con, run)
            run_id = run_row["run_id"]
            streams = []
            for r in ranks:
                r.hello.source = run_row["source"] or ""
                r.hello.linked_run_id = run_row["linked_run_id"] or ""
                streams.append(
                    list(rank_stream(con, data_dir, run_id, r, run_id, client_id("archive", run_id, str(r.rank))))
                )
        finally:
            con.close()
    return run_id, streams


def replay(
    source: Path,
    *,
    endpoint: str,
    token: str | None = None,
    run: str | None = None,
    speed: float = 1.0,
    name: str | None = None,
    tls_ca: str | None = None,
) -> dict:
    """Re-send a run as a new one; each rank's rows are read a step range at a time while they
    are sent (CHUNK_ROWS), so memory stays bounded however long the run."""
    if not (math.isfinite(speed) and speed >= 0):  # nan compares false to everything: say so here
        raise ValueError(f"--speed must be a finite number >= 0 (0 = as fast as possible), got {speed}")
    with tempfile.TemporaryDirectory(prefix="rankscope-replay-") as tmp:
        data_dir, run = open_source(Path(source), run, Path(tmp))
        con = catalog.connect(data_dir)
        try:
            # A live collector may be compacting this data dir while it is read (here and in _chunks).
            run_row, ranks = catalog.with_segment_retry(lambda: open_run(con, run))
            new_name = name or run_row["name"] or run_row["run_id"]
            new_run = new_run_id(new_name)
            for r in ranks:
                r.hello.run_name = new_name
            total = sum(r.rows for r in ranks)
            progress = tqdm(total=total, desc=f"replay {run_row['run_id']}", unit="row", disable=None, leave=False)
            with GrpcSink(endpoint, token, tls_ca=tls_ca) as sink, progress as bar:
                wall0 = time.monotonic()
                sink.send(
                    [
                        rank_stream(
                            con,
                            data_dir,
                            run_row["run_id"],
                            r,
                            new_run,
                            client_id("replay", new_run, str(r.rank)),
                            speed,
                            run_row["first_ns"],
                            wall0,
                            bar,
                        )
                        for r in ranks
                    ]
                )
        finally:
            con.close()
    return {"run_id": new_run, "linked_run_id": run_row["run_id"], "rows": total, "ranks": len(ranks)}


def main(args) -> int:
    try:
        r = replay(
            Path(args.path),
            endpoint=args.endpoint,
            token=args.token,
            run=args.run,
            speed=args.speed,
            name=args.name,
            tls_ca=args.tls_ca,
        )
    except (ExportError, SinkError, ValueError, FileNotFoundError) as exc:
        print(f"rankscope replay: {exc}", file=sys.stderr)
        return 1
    print(f"replayed run {r['linked_run_id']} as {r['run_id']}: {r['rows']} rows from {r['ranks']} ranks")
    return 0
