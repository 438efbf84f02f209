"""Background merging of small segments, so a long run is not 100k tiny files.

The store writes one segment per (table, run) per flush -- a few per second.
Every ``interval`` seconds the compactor looks at each partition and merges the
oldest small segments (smaller than ``target_bytes``) into one ``cmp-*``
segment, through the same ledger commit as a flush: the output is written under
a temporary name, the commit record names inputs and output, then the inputs are
unlinked and the output renamed in, and the ledger publishes the new manifest.
Readers read the manifest, so they see the inputs or the output, never neither or
both; the inputs' snapshot links are deleted ``delete_after_s`` later, by this
thread (collector/server/ledger.py). A crash anywhere is rolled forward or back by
the ledger at start-up.

The collector's own tables (runs, ranks, rank_ends, rank_events: a few rows per rank, one small
segment per run per table) are folded across runs: every pass merges the segments waiting in
their runs' partitions into one segment of the shared partition ``run=@all`` (collector.data.layout)
and removes the emptied folders, and that partition is then merged like any other. 10,000 runs
are then a few files, not 20,000-30,000: the ``runs`` and ``ranks`` views read those, and the
passes of an idle collector walk a handful of folders.

Every segment is checked once: its footer when the compactor first sees it, its
every page when it is merged. One that cannot be read (truncated, bytes flipped)
is moved to ``D/quarantine/<table>/run=<id>/`` with one log line naming it and
why, so readers never meet it again; the other partitions are compacted as usual.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from collector.data import layout
from collector.data.catalog import segment_problem
from collector.data.config import ConfigBlock, setting
from collector.data.queries import DataDirError
from collector.data.schema import as_stored
from collector.server import write_status
from collector.server.ledger import DELETE_AFTER_S, Ledger
from collector.server.retention import Retention
from collector.server.store import segment_order, segment_path, write_segment

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CompactionConfig(ConfigBlock):
    SECTION: ClassVar[str] = "compaction"
    interval: float = setting(5.0, gt=0)  # s between scans
    min_files: int = setting(8, ge=2)  # merge once this many small segments are waiting...
    target_bytes: int = setting(64 << 20, ge=1)  # ...into segments of about this size; bigger ones are left alone
    max_files: int = setting(256, ge=2)  # per merge, to bound memory
    # retention: 0 keeps every raw comm record; N keeps them for every Nth step and every step with
    # a finding (collector/data/retention.py). Either way settled steps get their per-step rollup
    # (comm_steps) and step analysis (step_analysis), so queries read those instead of raw records
    raw_every: int = setting(0, ge=0)
    retention_window: int = setting(100, ge=1)  # settled steps to gather before rolling them up
    # raw comm rows one window may read into memory (~100 B each in Arrow): at 8,192 ranks a
    # 100-step window would be 80 M of them, so a window then ends after fewer steps
    max_window_rows: int = setting(8_000_000, ge=1)
    # s a merged (or thinned, or quarantined) segment stays readable after the manifest stops naming it:
    # longer than any read (user queries stop at 30 s), so no reader ever finds a file gone
    delete_after_s: float = setting(DELETE_AFTER_S, ge=0)
    # collector-table segments one fold merges (they are tiny: a row or two per rank)
    fold_max_files: int = setting(4096, ge=2)

    def validate(self) -> None:
        if self.max_files < self.min_files:
            self.fail("max_files", f"must be >= {self.key('min_files')} ({self.min_files})", self.max_files)


def pick_inputs(sizes: list[tuple[Path, int]], config: CompactionConfig) -> list[Path]:
    """The oldest run of small segments worth merging, or [] if none is.

    ``sizes`` is (path, bytes) in commit order. Taking the oldest first keeps
    merged files in roughly time order; stopping at target_bytes makes each
    merge produce one segment of about the target size, so files grow
    geometrically and every row is rewritten only a few times."""
    chosen, total = [], 0
    for path, size in sizes:
        if size >= config.target_bytes:
            continue
        if chosen and (total + size > config.target_bytes or len(chosen) == config.max_files):
            break
        chosen.append(path)
        total += size
    if len(chosen) >= config.min_files or (len(chosen) >= 2 and total >= config.target_bytes // 2):
        return chosen
    return []


class Compactor:
    def __init__(self, data_dir: Path, ledger: Ledger, config: CompactionConfig | None = None):
        self.data_dir = Path(data_dir).resolve()  # the ledger holds segments by their absolute paths
        self.ledger = ledger
        self.config = config or CompactionConfig()
        self.merges = 0
        self._disk_full = False  # said once (collector.server.write_status), until a pass succeeds
        self._settled: dict[Path, int] = {}  # partition -> dir mtime when it had nothing to merge
        self._footers_ok: set[Path] = set()  # segments whose footer was read once already
        self._stop = threading.Event()
        # one pass at a time: the background thread's, or one asked for (``run_pass``, e.g. SIGUSR1)
        self._pass_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="rankscope-compact", daemon=True)
        self.retention = Retention(self.data_dir, ledger, self.config)

    def start(self) -> Compactor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        try:  # Linux threads are tasks: lower this one's priority so ingest wins the CPU
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while not self._stop.wait(self.config.interval):
            self.run_pass()

    def run_pass(self) -> int:
        """One pass of the background thread's work (rollups, merges, retired segments deleted) on the
        calling thread, at its priority; returns the merges made. Passes never overlap: a pass asked
        for while the background thread is in one waits for it. The collector runs one when asked
        (``rankscope collect`` on SIGUSR1), so an operator or a test need not wait for the next scan
        of a thread that runs at nice +10."""
        merges = 0
        with self._pass_lock:
            try:
                merges = self.run_once()
            except Exception as exc:  # a failed merge leaves its inputs in place; try again next scan
                self._failed("compaction", exc)
            else:
                self._disk_full = False
            try:
                self.ledger.collect_garbage(self.config.delete_after_s)
            except OSError:
                log.exception("deleting retired segments failed; trying again next scan")
        return merges

    def _failed(self, what: str, exc: BaseException) -> None:
        """A full disk is said once until a pass succeeds (the store says it too); anything else
        with its traceback."""
        if write_status.reason(exc) != "disk full":
            log.exception("%s failed; its segments are left as they are", what)
        elif not self._disk_full:
            self._disk_full = True
            log.warning("%s waits: disk full; its segments are left as they are, tried again each pass", what)

    def run_once(self) -> int:
        """One pass over every partition; returns how many merges were made."""
        # Rollups need every rank's records of a step: with several writers none sees them all.
        if self.ledger.writer is None:
            for partition in layout.partitions(self.data_dir, "comm"):
                if self._stop.is_set():
                    break
                try:
                    self.retention.run(partition)
                except (
                    OSError,
                    pa.ArrowException,
                    duckdb.Error,
                    DataDirError,
                ) as exc:  # a damaged segment: quarantined below
                    log.warning("rollups of %s wait for the next pass: %s", partition, exc)
        merges = self.fold()
        for partition in layout.partitions(self.data_dir):
            if self._stop.is_set():
                break
            try:
                merges += self._compact(partition)
            except Exception as exc:  # one partition's trouble must not stop the others
                self._failed(f"compaction of {partition}", exc)
        self.merges += merges
        return merges

    def catch_up(self) -> None:
        """Everything the background thread would have done by now, at once (for data dirs written
        without a collector running, e.g. ``rankscope simulate --data-dir``): every window of settled
        steps rolled up, then the small segments merged, and what they replaced deleted."""
        if self.ledger.writer is None:
            for partition in layout.partitions(self.data_dir, "comm"):
                while self.retention.run(partition, offline=True):
                    pass
        self.merges += self.fold()
        for partition in layout.partitions(self.data_dir):
            while merges := self._compact(partition):  # until its merged segments are merged in turn
                self.merges += merges
        # Offline, nobody is expected to be reading: the merged-away files go now rather than
        # hold their disk space until a collector next runs here (a reader that was is retried).
        self.ledger.collect_garbage(0)

    def fold(self) -> int:
        """Merge the collector tables' segments waiting in their runs' partitions into the shared
        partition (one segment per table and pass, ``fold_max_files`` inputs at most each), then
        remove the folders left empty; returns how many merges were made."""
        merges = 0
        for table in layout.COLLECTOR_TABLES:
            if self._stop.is_set():
                break
            try:
                entries = [e for e in os.scandir(layout.table_dir(self.data_dir, table)) if e.is_dir()]
            except FileNotFoundError:
                continue
            waiting: list[tuple[tuple[int, int], Path]] = []
            partitions = []
            for entry in entries:
                partition = Path(entry.path)
                if layout.run_of(partition) is None or layout.is_shared(partition):
                    continue
                partitions.append(partition)
                files = list(partition.glob(f"*{layout.SEGMENT_SUFFIX}"))
                self.ledger.note_foreign(
                    partition, [p for p in files if not layout.ANY_WRITER_SEGMENT_RE.match(p.stem)]
                )
                for path in files:
                    order = segment_order(path, self.ledger.writer)
                    if order is not None and self._footer_reads(path):
                        waiting.append((order, path))
            waiting.sort()
            inputs = [p for _, p in waiting]
            for start in range(0, len(inputs), self.config.fold_max_files):
                if self._stop.is_set():
                    break
                chunk = inputs[start : start + self.config.fold_max_files]
                if self._merge(layout.partition_dir(self.data_dir, table, layout.SHARED_RUN), chunk):
                    merges += 1
                    self.retention.changed({layout.run_of(p.parent) for p in chunk})
            for partition in partitions:
                try:  # only an empty folder goes (a store write recreates it: store.write_segment)
                    partition.rmdir()
                except OSError:
                    continue
                self._settled.pop(partition, None)
        return merges

    def _compact(self, partition: Path) -> int:
        """Merges the segments the partition holds as this pass lists it; what lands during the
        pass waits for the next one. (Re-listing after each merge never ended under sustained
        ingest: each merge took longer than two flushes, so the pass, and every partition after
        this one, the rollups and the deletion of retired segments, waited for the ingest to stop.)"""
        try:
            mtime = partition.stat().st_mtime_ns  # taken before listing, so nothing slips by
        except FileNotFoundError:
            self._settled.pop(partition, None)
            return 0
        if self._settled.get(partition) == mtime:
            return 0  # no file came or went since it last had nothing to merge
        # Only segments the store named: files put there by hand or by git are left alone
        # (and listed to readers as they are).
        files = list(partition.glob(f"*{layout.SEGMENT_SUFFIX}"))
        self.ledger.note_foreign(partition, [p for p in files if not layout.ANY_WRITER_SEGMENT_RE.match(p.stem)])
        ours = [(order, p) for p in files if (order := segment_order(p, self.ledger.writer)) is not None]
        segments = [p for _, p in sorted(ours) if self._footer_reads(p)]
        sizes = []
        for path in segments:
            try:
                sizes.append((path, path.stat().st_size))
            except FileNotFoundError:
                pass
        merges = 0
        while not self._stop.is_set():
            inputs = pick_inputs(sizes, self.config)
            if not inputs:
                if not merges:
                    self._settled[partition] = mtime
                break
            if not self._merge(partition, inputs):
                break  # left as they are (or quarantined): the next pass lists the partition again
            merges += 1
            merged = set(inputs)
            sizes = [(path, size) for path, size in sizes if path not in merged]
        return merges

    def _footer_reads(self, path: Path) -> bool:
        if path in self._footers_ok:
            return True
        problem = segment_problem(path)
        if problem:
            self._quarantine(path, problem)
            return False
        self._footers_ok.add(path)
        return True

    def _quarantine(self, path: Path, why: str) -> None:
        self._footers_ok.discard(path)
        self.ledger.withdraw(path)  # readers stop taking it first
        target = self.data_dir / layout.QUARANTINE_DIR / path.relative_to(self.data_dir / layout.PARQUET_DIR)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
        except FileNotFoundError:
            return  # already gone (merged or removed by hand)
        log.warning("quarantined unreadable segment %s -> %s: %s", path, target, why)

    def _merge(self, partition: Path, inputs: list[Path]) -> bool:
        """Merge ``inputs`` into a segment of ``partition`` (theirs, or the shared one for a fold);
        an input that does not read is quarantined and the merge left for
        the next pass. Returns whether a merge was made."""
        tables = []
        for path in inputs:
            try:
                tables.append(as_stored(pq.ParquetFile(path).read()))  # a segment of any age
            except (OSError, pa.ArrowException) as exc:
                self._quarantine(path, str(exc) or type(exc).__name__)
        if len(tables) < len(inputs):
            return False
        # A segment written before a column was added lacks it: the merged file has it, as nulls.
        schema = pa.unify_schemas([t.schema for t in tables])
        table, run_id = partition.parent.name, layout.run_of(partition)
        commit = self.ledger.reserve_commit()
        output = segment_path(self.data_dir, table, run_id, layout.segment_prefix("cmp", self.ledger.writer), commit)
        write_segment(output, schema, (_conform(t, schema) for t in tables))
        self.ledger.commit_compaction(commit, inputs, [output])
        self._footers_ok.difference_update(inputs)
        log.debug("merged %d segments of %s/%s into %s", len(inputs), table, run_id, output.name)
        return True


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns in its order, missing ones as nulls."""
    return pa.table(
        [table[f.name] if f.name in table.column_names else pa.nulls(table.num_rows, f.type) for f in schema],
        schema=schema,
    )
