"""``rankscope export``: a run out of a data dir, in four shapes.

- ``--perfetto RUN OUT.json``: Chrome trace-event JSON (opens in ui.perfetto.dev
  and chrome://tracing). One process per rank (pid = rank), in it one thread per
  communication group (every collective a complete event 'X', ts/dur in µs, its
  bytes/seq/step/bandwidth in args) and one thread for the engine timers. Times
  are relative to the run's first event; ``otherData.t0_unix_ns`` gives that
  instant. Comm rows without times (imported summaries) cannot be drawn and are
  counted in ``otherData.comm_rows_without_times``.
- ``--archive RUN OUT``: one tar file holding the run's committed Parquet segments
  under the data-dir layout (``parquet/<table>/run=<id>/...``, the collector's
  runs/ranks/rank_ends rows included) and a ``manifest.json``. Unpacked, it is a
  data dir; ``rankscope replay OUT`` streams it into a collector.
- ``--parquet RUN OUTDIR``: ``OUTDIR/<table>.parquet`` per table with rows, with
  ``run_id`` and ``rank`` columns; ``rankscope import OUTDIR`` reads them back.
- ``--flight-recorder RUN DIR``: one PyTorch Flight Recorder dump per rank, for torch's analyzer
  (the section below says how).

RUN is a run id or a run name (the latest run of that name).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import tarfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from collector.data import catalog, layout, queries
from collector.data.queries import export as export_sql
from collector.data.schema import TABLES, as_stored, reading_schema
from collector.tools.importers.parquet_table import TABLE_KEY

ARCHIVE_FORMAT = "rankscope-archive-1"
MANIFEST = "manifest.json"
TRACE_BATCH = 65_536


class ExportError(Exception):
    """A run that does not exist, an unwritable output; the message says which."""


def resolve_run(con, run: str) -> str:
    try:
        return queries.resolve_run(con, run)
    except queries.UnknownRun as exc:
        raise ExportError(str(exc)) from None


# -- perfetto ----------------------------------------------------------------------


def _write_events(f, events, bar) -> int:
    n = 0
    for batch in events:
        lines = batch.column(0).to_pylist()
        if lines:
            f.write(",\n" + ",\n".join(lines))
            n += len(lines)
            bar.update(len(lines))
    return n


def export_perfetto(data_dir, run: str, out) -> dict:
    """Write the trace; returns counts (events per kind) for the caller to print."""
    con = catalog.connect(data_dir)
    try:
        con.execute("SET enable_progress_bar = false")  # ours is tqdm
        run_id = resolve_run(con, run)
        t0, comm_total, comm_timed, timers_total = export_sql.trace_extent(con, run_id)
        tracks = export_sql.trace_tracks(con, run_id)
        ranks = sorted(export_sql.trace_ranks(con, run_id) | {r for r, _, _ in tracks})
        t0 = t0 or 0
        meta = []
        for rank in ranks:
            meta += [
                {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
                {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
                {"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "engine timers"}},
            ]
        meta += [
            {
                "ph": "M",
                "name": "thread_name",
                "pid": rank,
                "tid": tid,
                "args": {"name": f"comm {group}" if group else "comm"},
            }
            for rank, group, tid in tracks
        ]
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        with (
            open(tmp, "w") as f,
            tqdm(total=comm_timed + timers_total, desc="perfetto", unit="event", disable=None, leave=False) as bar,
        ):
            f.write('{"traceEvents": [\n' + ",\n".join(json.dumps(m, separators=(",", ":")) for m in meta))
            counts = {
                "comm": _write_events(f, export_sql.comm_events(con, run_id, t0, TRACE_BATCH), bar),
                "timers": _write_events(f, export_sql.timer_events(con, run_id, t0, TRACE_BATCH), bar),
            }
            other = {"run_id": run_id, "t0_unix_ns": t0, "comm_rows_without_times": comm_total - counts["comm"]}
            f.write('\n], "displayTimeUnit": "ns", "otherData": ' + json.dumps(other) + "}\n")
        tmp.replace(out)
        return {"run_id": run_id, **counts, "ranks": len(ranks), "groups": len(tracks)}
    finally:
        con.close()


# -- archive -------------------------------------------------------------------------


def _run_segments(data_dir: Path, run_id: str) -> list[Path]:
    """The run's segments as of one commit (the collector's manifest; catalog.snapshot_files), or
    in a data dir without one, those its partition folders hold."""
    snapshot = catalog.snapshot_files(data_dir)
    if snapshot is not None:
        partition = f"{layout.PARTITION_PREFIX}{run_id}"
        return [data_dir / f for files in snapshot.values() for f in files if Path(f).parent.name == partition]
    found = []
    for table in layout.stored_schemas():
        part = layout.partition_dir(data_dir, table, run_id)
        if part.is_dir():
            found += sorted(
                p for p in part.iterdir() if p.name.endswith(layout.SEGMENT_SUFFIX) and not p.name.startswith(".")
            )
    return found


def _shared_rows(data_dir: Path, run_id: str) -> dict[str, bytes]:
    """The run's rows of the collector tables that compaction folded into their shared partitions
    (collector.data.layout.SHARED_PARTITION), as one Parquet file per table under the run's own
    partition: archive name -> bytes. A file merged away meanwhile raises FileNotFoundError (retried)."""
    snapshot = catalog.snapshot_files(data_dir)
    out = {}
    for table, schema in layout.COLLECTOR_TABLES.items():
        if snapshot is not None:
            files = [data_dir / f for f in snapshot.get(table, []) if Path(f).parent.name == layout.SHARED_PARTITION]
        else:
            shared = layout.partition_dir(data_dir, table, layout.SHARED_RUN)
            files = sorted(shared.glob(f"*{layout.SEGMENT_SUFFIX}")) if shared.is_dir() else []
        read = reading_schema(schema)  # segments of any age: older ones hold ns timestamps
        parts = [as_stored(pq.read_table(f, schema=read, filters=[("run_id", "==", run_id)])) for f in files]
        rows = [t for t in parts if t.num_rows]
        if not rows:
            continue
        buffer = io.BytesIO()
        pq.write_table(pa.concat_tables(rows), buffer, compression="zstd")
        name = layout.partition_dir(Path(), table, run_id) / f"shared{layout.SEGMENT_SUFFIX}"
        out[name.as_posix()] = buffer.getvalue()
    return out


def _archived_name(data_dir: Path, path: Path) -> str:
    """parquet/<table>/run=<id>/<name>, also for the snapshot link of a segment."""
    return str(catalog.partition_path_of(data_dir, path).relative_to(data_dir))


def export_archive(data_dir, run: str, out) -> dict:
    data_dir = Path(data_dir).resolve()
    con = catalog.connect(data_dir)
    try:
        run_id = resolve_run(con, run)
        run_row = export_sql.run_header(con, run_id)
    finally:
        con.close()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    for attempt in range(3):  # a compaction may replace a segment while we read
        segments = _run_segments(data_dir, run_id)
        try:
            shared = _shared_rows(data_dir, run_id)
            with tarfile.open(tmp, "w") as tar:
                manifest = {
                    "format": ARCHIVE_FORMAT,
                    "run_id": run_id,
                    "name": run_row[0],
                    "world_size": run_row[1],
                    "source": run_row[2],
                    "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "files": [_archived_name(data_dir, p) for p in segments] + list(shared),
                }
                data = json.dumps(manifest, indent=1).encode()
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))
                for path in tqdm(segments, desc="archive", unit="file", disable=None, leave=False):
                    tar.add(path, arcname=_archived_name(data_dir, path))
                for name, data in shared.items():
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(data), int(time.time())
                    tar.addfile(info, io.BytesIO(data))
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    tmp.replace(out)
    return {"run_id": run_id, "files": len(segments), "bytes": out.stat().st_size}


def is_archive(path: Path) -> bool:
    if not path.is_file() or not tarfile.is_tarfile(path):
        return False
    try:
        with tarfile.open(path) as tar:
            return MANIFEST in tar.getnames()
    except (tarfile.TarError, OSError):
        return False


def unpack_archive(path: Path, dest: Path) -> dict:
    """Unpack into ``dest`` (which becomes a data dir); returns the manifest."""
    with tarfile.open(path) as tar:
        manifest = json.load(tar.extractfile(MANIFEST))
        if manifest.get("format") != ARCHIVE_FORMAT:
            raise ExportError(f"{path}: archive format {manifest.get('format')!r}, expected {ARCHIVE_FORMAT}")
        members = [m for m in tar.getmembers() if m.name != MANIFEST]
        for m in members:
            if not m.isfile() or not m.name.startswith(f"{layout.PARQUET_DIR}/") or ".." in Path(m.name).parts:
                raise ExportError(f"{path}: unexpected member {m.name!r}")
        tar.extractall(dest, members=members, filter="data")
    return manifest


# -- parquet ---------------------------------------------------------------------------


def export_parquet(data_dir, run: str, outdir) -> dict:
    con = catalog.connect(data_dir)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = {}
    try:
        run_id = resolve_run(con, run)
        tables = [*TABLES, "runs", "ranks", "rank_ends"]
        for table in tqdm(tables, desc="parquet", unit="table", disable=None, leave=False):
            reader = export_sql.table_rows(con, table, run_id, TRACE_BATCH)
            schema = reader.schema.with_metadata({TABLE_KEY: table.encode()})
            rows, path = 0, outdir / f"{table}.parquet"
            writer = None
            for batch in reader:
                if batch.num_rows == 0:
                    continue
                if writer is None:
                    writer = pq.ParquetWriter(path.with_name(f".{path.name}.tmp"), schema, compression="zstd")
                writer.write_batch(batch)
                rows += batch.num_rows
            if writer is not None:
                writer.close()
                path.with_name(f".{path.name}.tmp").replace(path)
                written[table] = rows
        return {"run_id": run_id, "tables": written}
    finally:
        con.close()


# -- Flight Recorder ---------------------------------------------------------------

# ``rankscope export --flight-recorder RUN DIR``: one PyTorch Flight Recorder dump per rank
# (``DIR/rank_<r>``, a pickle as NCCL's watchdog writes), for torch's own analyzer:
#
#     python -m torch.distributed.flight_recorder.fr_trace DIR -p rank_
#
# A rank's dump holds its collectives in seq order: each completed one (a ``comm`` row) as a
# ``completed`` entry, each still open (the ``inflight_open`` view: entered, not completed, the rank
# not ended) as ``started``, with the times rankscope recorded. Groups keep the hook's names as pg
# names; ``world`` is the default group (``default_pg``). An entry's sizes come from ``numel`` (the
# op's data size S) and the group size: all_gather's input is S / n, reduce_scatter's output S / n.
# p2p rows (``p2p[a->b]`` groups) are left out. The ops the analyzer knows run under their
# ``nccl:`` names (so it matches them as NCCL's would be).

FR_VERSION = "2.10"  # the dump format torch 2.13 writes
FR_PREFIX = "rank_"
# our op -> Flight Recorder's profiling name (what torch records for that call)
FR_OPS = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "allreduce_coalesced",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "_all_gather_base",
    "all_gather_coalesced": "ALLGATHER_coalesced",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
}
_GATHERS = {"all_gather", "all_gather_into_tensor", "all_gather_coalesced", "gather"}
_SCATTERS = {"reduce_scatter", "reduce_scatter_tensor", "scatter"}
# torch dtype names (comm.dtype) -> c10 ScalarType names (what Flight Recorder records)
FR_DTYPES = {
    "float32": "Float",
    "float64": "Double",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int16": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
}


def _desc(group: str) -> str:
    return "default_pg" if group == "world" else group


def _members(group: str, size: int, world: int) -> list[int]:
    """A group's ranks from its name (``g[0-3]``, ``tp[0-1]``: schema.group_name), else 0..size-1."""
    role, bracket, rest = group.partition("[")
    if group == "world" or not bracket or role == "p2p":
        return list(range(world if group == "world" else size))
    out = []
    for part in rest.split("]")[0].split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _sizes(op: str, numel: int, n: int) -> tuple[list, list]:
    """(input_sizes, output_sizes) of an op moving S = ``numel`` elements in a group of ``n``."""
    numel = numel or 0
    if op in _GATHERS:
        return [[numel // max(n, 1)]], [[numel]]
    if op in _SCATTERS:
        return [[numel]], [[numel // max(n, 1)]]
    return [[numel]], [[numel]]


def export_flight_recorder(data_dir, run: str, outdir) -> dict:
    con = catalog.connect(data_dir)
    try:
        run_id = resolve_run(con, run)
        world = export_sql.run_header(con, run_id)[1]
        rows = export_sql.flight_recorder_rows(con, run_id)
    finally:
        con.close()
    if not rows:
        raise ExportError(f"run {run_id} has no collectives to export")
    world = int(world or 0) or 1 + max((r[0] for r in rows), default=0)
    groups: dict[str, list[int]] = {}
    dumps: dict[int, list[dict]] = {r: [] for r in range(world)}
    for rank, group, size, seq, op, dtype, numel, start, end, state in rows:
        members = groups.setdefault(group, _members(group, int(size or world), world))
        inputs, outputs = _sizes(op, numel, len(members))
        fr_dtype = FR_DTYPES.get(dtype, dtype or "Float")
        entries = dumps.setdefault(rank, [])
        entries.append(
            {
                "record_id": len(entries),
                "pg_id": list(groups).index(group),
                "process_group": (group, _desc(group)),
                "collective_seq_id": int(seq),
                "p2p_seq_id": 0,
                "op_id": int(seq),
                "profiling_name": f"nccl:{FR_OPS.get(op, op)}",
                "time_created_ns": int(start or 0),
                "input_sizes": inputs,
                "input_dtypes": [fr_dtype] * len(inputs),
                "output_sizes": outputs,
                "output_dtypes": [fr_dtype] * len(outputs),
                "state": state,
                "time_discovered_started_ns": int(start) if start else None,
                "time_discovered_completed_ns": int(end) if end else None,
                "duration_ms": (end - start) / 1e6 if start and end else None,
                "retired": state == "completed",
                "timeout_ms": 0,
                "is_p2p": False,
                "thread_name": "",
                "thread_id": "",
                "frames": [],
            }
        )
    pg_config = {g: {"name": g, "desc": _desc(g), "ranks": str(m)} for g, m in groups.items()}
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for rank, entries in sorted(dumps.items()):
        dump = dict(version=FR_VERSION, pg_config=pg_config, pg_status={}, comm_lib_version="", entries=entries)
        path = outdir / f"{FR_PREFIX}{rank}"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(pickle.dumps(dump, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)
    return {"run_id": run_id, "ranks": len(dumps), "entries": len(rows), "groups": len(groups)}


def main(args) -> int:
    try:
        if args.perfetto:
            r = export_perfetto(args.data_dir, *args.perfetto)
            print(
                f"wrote {args.perfetto[1]}: run {r['run_id']}, {r['ranks']} ranks, {r['groups']} comm tracks, "
                f"{r['comm']} collectives, {r['timers']} timer events"
            )
        elif args.flight_recorder:
            r = export_flight_recorder(args.data_dir, *args.flight_recorder)
            print(
                f"wrote {args.flight_recorder[1]}: run {r['run_id']}, {r['ranks']} ranks, {r['entries']} collectives; "
                f"analyse with: python -m torch.distributed.flight_recorder.fr_trace {args.flight_recorder[1]} -p rank_"
            )
        elif args.archive:
            r = export_archive(args.data_dir, *args.archive)
            print(f"wrote {args.archive[1]}: run {r['run_id']}, {r['files']} segments, {r['bytes']} bytes")
        else:
            r = export_parquet(args.data_dir, *args.parquet)
            tables = ", ".join(f"{n} {t}" for t, n in r["tables"].items())
            print(f"wrote {args.parquet[1]}: run {r['run_id']}: {tables}")
    except (ExportError, FileNotFoundError, OSError) as exc:
        print(f"rankscope export: {exc}", file=sys.stderr)
        return 1
    return 0
