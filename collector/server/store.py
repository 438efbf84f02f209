"""Buffers accepted rows in Arrow and group-commits them to Parquet segments.

The server hands each envelope's rows to ``Store.submit`` together with a
callback. Rows accumulate per (table, run) and a flusher thread commits them
every ``flush_interval`` seconds (or sooner when ``flush_bytes`` are buffered):
one zstd Parquet segment per (table, run) per commit, committed through the
ledger (collector/ledger.py). Callbacks -- which send the acks -- run only after
the commit, so an ack always means durable.

Deduplication happens here: an envelope whose (client_id, seq) is durable is
acknowledged at once; one that is already buffered or being committed (the same
envelope resent on a second stream) just waits for that commit.

A commit that fails (disk full) acknowledges nothing: the clients resend, and each resend tries
again, so the store resumes by itself once it can write; a collector's ``write_status``
(collector.server.write_status) says so once in its log, on /metrics and to ``rankscope health``.

Segment names are ``seg-<commit>-<part>.parquet`` (``cmp-`` for compaction
output): unique, in commit order, and recognisably the store's own.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq

from collector.data import layout
from collector.data.codec import Rows
from collector.data.config import ConfigBlock, setting
from collector.server.ledger import Ledger

log = logging.getLogger(__name__)

Callback = Callable[[BaseException | None], None]

ROW_GROUP_ROWS = 1 << 20
SPLIT_ROWS = 200_000  # a (table, run) buffer this big is written as two segments in parallel

PARQUET_OPTIONS = {"compression": "zstd", "compression_level": 1}
# Min/max statistics only where queries filter (DuckDB skips row groups with them);
# computing them for every column costs ~20% of the write.
STATISTICS_COLUMNS = ("run_id", "rank", "step", "seq", "start_ns", "time_ns")
# Columns (nearly) unique per record: dictionary-encoding them only costs time
# before the writer falls back to plain encoding (-20% write CPU on comm rows).
UNIQUE_COLUMNS = frozenset(("seq", "start_ns", "end_ns", "time_ns", "algbw_gbs", "busbw_gbs"))


def parquet_options(schema: pa.Schema) -> dict:
    stats = [name for name in STATISTICS_COLUMNS if name in schema.names]
    dictionary = [name for name in schema.names if name not in UNIQUE_COLUMNS]
    return {**PARQUET_OPTIONS, "write_statistics": stats or False, "use_dictionary": dictionary or False}


class StoreClosed(RuntimeError):
    """Submitted after close() began."""


@dataclass(kw_only=True)
class StoreConfig(ConfigBlock):
    SECTION: ClassVar[str] = "store"
    # s; a record is durable (and visible) at most this long + one write later
    flush_interval: float = setting(0.25, gt=0, le=5)
    flush_bytes: int = setting(64 << 20, ge=1)  # buffered Arrow bytes that trigger a flush before the interval
    max_buffered_bytes: int = setting(512 << 20, ge=1)  # beyond this, submit blocks: back-pressure on the streams

    def validate(self) -> None:
        if self.max_buffered_bytes < self.flush_bytes:
            self.fail(
                "max_buffered_bytes",
                f"must be >= {self.key('flush_bytes')} ({self.flush_bytes})",
                self.max_buffered_bytes,
            )


def mkdir_durable(path: Path) -> None:
    """mkdir -p whose new entries survive a crash (the parent directory is fsync'd)."""
    if path.is_dir():
        return
    mkdir_durable(path.parent)
    try:
        path.mkdir()
    except FileExistsError:
        return
    layout.fsync_dir(path.parent)


def write_segment(final: Path, schema: pa.Schema, tables: Iterable[pa.Table]) -> int:
    """Write ``tables`` (one after another) and fsync them at the temporary name of
    ``final``; returns the row count. Row groups of up to ROW_GROUP_ROWS rows are
    written as soon as they fill, so memory stays bounded whatever the total."""
    tmp = layout.temp_name(final)
    rows, pending, pending_rows = 0, [], 0
    # A path, not a Python file object: Arrow then writes natively without taking the GIL.
    with _open_writer(tmp, schema) as writer:
        for table in tables:
            pending.append(table)
            pending_rows += table.num_rows
            if pending_rows >= ROW_GROUP_ROWS:
                writer.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
                rows, pending, pending_rows = rows + pending_rows, [], 0
        if pending or rows == 0:
            writer.write_table(
                pa.concat_tables(pending) if pending else schema.empty_table(), row_group_size=ROW_GROUP_ROWS
            )
            rows += pending_rows
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    # Checked before it is committed: a segment whose footer does not read back would
    # otherwise be found only by the readers it breaks.
    stored = pq.read_metadata(tmp).num_rows
    if stored != rows:
        raise OSError(f"segment {tmp} reads back {stored} rows, {rows} were written")
    return rows


def _open_writer(tmp: Path, schema: pa.Schema, attempts: int = 3) -> pq.ParquetWriter:
    """A writer at ``tmp``, its folder made first. Compaction removes the emptied partitions of the
    collector tables (compaction.Compactor.fold), so the folder may go between the two: make it again."""
    for attempt in range(attempts):
        mkdir_durable(tmp.parent)
        try:
            return pq.ParquetWriter(str(tmp), schema, **parquet_options(schema))
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def segment_path(data_dir: Path, table: str, run_id: str, prefix: str, commit: int, part: int = 0) -> Path:
    """``<prefix>-<commit>-<part>.parquet``: names sort in commit order."""
    return layout.partition_dir(data_dir, table, run_id) / f"{prefix}-{commit:010d}-{part}{layout.SEGMENT_SUFFIX}"


SEGMENT_NAME = re.compile(r"^(seg|cmp)-(\d+)-(\d+)$")


def segment_order(path: Path, writer: str | None = None) -> tuple[int, int] | None:
    """(commit, part) of a segment this store (as ``writer``) wrote; None for any other file."""
    match = (SEGMENT_NAME if writer is None else layout.segment_name_re(writer)).match(path.stem)
    return (int(match.group(2)), int(match.group(3))) if match else None


def _split(chunks: list[pa.Table], parts: int) -> list[list[pa.Table]]:
    """Chunks in `parts` groups of about equal rows, order kept."""
    total = sum(c.num_rows for c in chunks)
    groups: list[list[pa.Table]] = [[]]
    done = 0
    for chunk in chunks:
        if done >= total * len(groups) / parts and len(groups) < parts:
            groups.append([])
        groups[-1].append(chunk)
        done += chunk.num_rows
    return groups


class Store:
    def __init__(self, data_dir, config: StoreConfig | None = None, writer: str | None = None):
        """``writer``: this collector's id when several share ``data_dir`` (see collector/layout.py)."""
        self.data_dir = Path(data_dir).resolve()
        self.config = config or StoreConfig()
        mkdir_durable(self.data_dir / layout.PARQUET_DIR)
        self.ledger = Ledger(self.data_dir, writer)
        self.writer = self.ledger.writer
        self._known_runs = self._load_known_runs()
        self._cond = threading.Condition()
        self._buffers: dict[tuple[str, str], list[pa.Table]] = {}
        self._buffered_since: float | None = None
        self._flush_now = False
        self._bytes = 0  # buffered + being committed
        self._pending: dict[tuple[str, int], list[Callback]] = {}
        self._committing: dict[tuple[str, int], list[Callback]] = {}
        self._closing = False
        # monotonic time: every row submitted before it is committed and readable (a reader that
        # pinned D's snapshot after this moment has it: live_findings asks whether news is stored)
        self.visible_through = time.monotonic()
        self.records_durable = 0
        self.write_status = None  # a running collector's collector.server.write_status.WriteStatus
        self._writers = ThreadPoolExecutor(2, thread_name_prefix="rankscope-write")
        self._flusher = threading.Thread(target=self._flush_loop, name="rankscope-flush", daemon=True)
        self._flusher.start()

    # -- intake ------------------------------------------------------------

    def is_durable(self, client_id: str, seq: int) -> bool:
        """Whether envelope ``seq`` of ``client_id`` is committed (a resend of it needs no decoding)."""
        return self.ledger.is_durable(client_id, seq)

    def submit(self, client_id: str, seq: int, rows: list[Rows], on_durable: Callback) -> bool:
        """Queue one envelope. Returns False (and acks at once) if it is a duplicate."""
        key = (client_id, seq)
        if self.ledger.is_durable(client_id, seq):
            on_durable(None)
            return False
        with self._cond:
            while self._bytes >= self.config.max_buffered_bytes and not self._closing:
                self._cond.wait()
            for waiting in (self._pending, self._committing):
                if key in waiting:
                    waiting[key].append(on_durable)
                    return False
            if self.ledger.is_durable(client_id, seq):  # committed while we waited
                on_durable(None)
                return False
            if self._closing:
                raise StoreClosed("the collector is shutting down; resend to its successor")
            for table, run_id, batch in rows:
                if table == "runs":  # one runs row per run: the first Hello wins
                    if run_id in self._known_runs:
                        continue
                    self._known_runs.add(run_id)
                self._buffers.setdefault((table, run_id), []).append(batch)
                self._bytes += batch.nbytes
            self._pending[key] = [on_durable]
            if self._buffered_since is None:
                self._buffered_since = time.monotonic()
            self._cond.notify_all()
            return True

    def flush_soon(self) -> None:
        """Commit what is buffered now instead of at the end of ``flush_interval``: news a reader is
        waiting for (a collective crossed hang_after_s, a rank went away). Returns at once."""
        with self._cond:
            self._flush_now = True
            self._cond.notify_all()

    def flush(self) -> None:
        """Block until everything submitted so far is committed."""
        with self._cond:
            target = set(self._pending) | set(self._committing)
            self._flush_now = True
            self._cond.notify_all()
            while target & (set(self._pending) | set(self._committing)):
                self._cond.wait(0.05)

    def close(self) -> None:
        """Commit what is buffered, stop the flusher and release the data dir."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._flusher.join()
        self._writers.shutdown()
        self.ledger.close()
        if self.write_status is not None:
            self.write_status.close()

    # -- flushing ------------------------------------------------------------

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._pending:
                        due = self._buffered_since + self.config.flush_interval
                        if (
                            self._closing
                            or self._flush_now
                            or time.monotonic() >= due
                            or self._bytes >= self.config.flush_bytes
                        ):
                            break
                        self._cond.wait(max(0.0, due - time.monotonic()))
                    elif self._closing:
                        return
                    else:
                        self._cond.wait()
                buffers, self._buffers = self._buffers, {}
                self._committing, self._pending = self._pending, {}
                self._buffered_since, self._flush_now = None, False
                taken = time.monotonic()
            if self._commit(buffers):
                self.visible_through = taken

    def _commit(self, buffers: dict[tuple[str, str], list[pa.Table]]) -> bool:
        nbytes = sum(t.nbytes for ts in buffers.values() for t in ts)
        # records the ranks sent: not the collector's own rows (Hello/RunEnd tables, deliveries)
        nrows = sum(
            t.num_rows
            for (table, _), ts in buffers.items()
            if table not in layout.COLLECTOR_TABLES and table != "deliveries"
            for t in ts
        )
        commit = self.ledger.reserve_commit()
        # Segments are independent files: write them in parallel (pyarrow releases the GIL),
        # splitting a big buffer in two so that one busy run still uses two cores.
        jobs: list[tuple[list[pa.Table], Path]] = []
        for (table, run_id), chunks in buffers.items():
            parts = 2 if sum(c.num_rows for c in chunks) >= SPLIT_ROWS and len(chunks) > 1 else 1
            for part, group in enumerate(_split(chunks, parts)):
                jobs.append(
                    (
                        group,
                        segment_path(
                            self.data_dir, table, run_id, layout.segment_prefix("seg", self.writer), commit, part
                        ),
                    )
                )
        finals = [final for _, final in jobs]
        error: BaseException | None = None
        try:
            list(self._writers.map(lambda job: write_segment(job[1], job[0][0].schema, job[0]), jobs))
            acked: dict[str, list[int]] = {}
            for client_id, seq in self._committing:
                acked.setdefault(client_id, []).append(seq)
            self.ledger.commit_segments(commit, finals, acked)
        except Exception as exc:  # disk full, permissions: nothing is acked, clients resend
            if self.write_status is not None:  # said once per episode, with what people should read
                self.write_status.failed(exc, len(self._committing))
            else:
                log.exception("commit %d failed; %d envelopes not acknowledged", commit, len(self._committing))
            for final in finals:
                layout.temp_name(final).unlink(missing_ok=True)
            error = exc
        else:
            if self.write_status is not None:
                self.write_status.succeeded()
        with self._cond:
            done, self._committing = self._committing, {}
            self._bytes -= nbytes
            if error is None:
                self.records_durable += nrows
            else:  # the runs rows were lost with the commit: the resent Hello must write them
                self._known_runs -= {run_id for table, run_id in buffers if table == "runs"}
            self._cond.notify_all()
        for callbacks in done.values():
            for callback in callbacks:
                callback(error)
        return error is None

    def _load_known_runs(self) -> set[str]:
        """The runs with a runs row: in a partition of their own, or in the shared one (compaction folds them there)."""
        known = set()
        for p in layout.partitions(self.data_dir, "runs"):
            segments = list(p.glob(f"*{layout.SEGMENT_SUFFIX}"))
            if not layout.is_shared(p):
                known.update([layout.run_of(p)] if segments else [])
                continue
            for segment in segments:
                try:
                    known.update(pq.read_table(segment, columns=["run_id"])["run_id"].to_pylist())
                except FileNotFoundError:
                    pass  # merged by another writer sharing D: at worst a second runs row, which the view drops
        return known
