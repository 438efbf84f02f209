"""Rollups and retention: once a run's steps are settled, store per step what queries would
otherwise compute from every raw record -- the comm rollup (``comm_steps``) and the step analysis
(``step_analysis``: exposed communication, straggler cost) -- and, with ``collect --raw-every N``,
thin out the raw comm records of those steps (the policy is collector/data/retention.py), and the
run's captured evidence (collector.server.artifact_retention) and telemetry arrival times
(collector.server.delivery_retention) with them.

Runs in the compaction thread, per comm partition, on a window of *settled* steps: steps
every rank has moved past (each rank reported a later step) or, once the run ended, all of
them -- an instance's arrival delays need every rank's record, so a step is rolled up only
when no more of its records can come. The window starts after the last rolled-up step (the
max step of the run's ``comm_steps``) and is processed once it holds ``retention_window``
steps, when the run has ended, or when no rank has entered a collective for the run's
``hang_after_s`` (collector.data.hang_rule): a hung run never fills a window, since its stuck rank
reports no later step, and without this every reader would analyse its whole tail from raw records.

One pass, up to five ledger commits, in this order:

0. the rows of the window's instances it cannot settle (odd, or not every rank of the group in it)
   as an ``unsettled_instances`` segment, then the window's step analysis
   (collector.data.queries.analyse_steps over the raw records of the steps after the last analysed
   one) as a ``step_analysis`` segment: its last step says how far both go;
1. (``raw_every`` only) the run's deliveries up to the window's end (DELIVERY_LAG_STEPS before it
   while the run goes on) are judged against its slow-link findings (collector.server.delivery_retention);
2. the window's rollup (collector.data.queries.windows.window_rollup over the raw rows) is added as a
   ``comm_steps`` segment;
3. (``raw_every`` only) the comm segments holding rows of the window are replaced (as one compaction) by a segment
   without the raw rows of the steps the policy drops and, when some of them reach past the
   window (a flush that caught ranks on both sides of ``settled``), a second one with the rows
   past it, as they were: those are decided by a later window. Each row is judged once; a row
   past the window may be copied again, never dropped early.

The replacement is one ledger record naming every input and output, so a crash leaves the old
segments or the new ones (collector.server.ledger). A crash between the two commits leaves the
rollup and all raw rows of the window: readers take
rolled-up steps from the rollup only (queries.COMM_ROLLUP_SQL), so nothing is counted twice;
the window simply keeps more raw rows than the policy asks, never fewer. Only segments this
writer owns are touched; with several writers a run's ranks are split across them and no
writer sees a whole instance, so retention refuses to run with a writer id (the CLI says so).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collector.data import hang_rule, layout
from collector.data.queries import Catalog, analyse_steps
from collector.data.queries.windows import unsettled_rows, window_rollup
from collector.data.retention import DELIVERY_LAG_STEPS, steps_to_keep
from collector.data.schema import STEP_ANALYSIS_SCHEMA, UNSETTLED_INSTANCES_SCHEMA
from collector.server.artifact_retention import ArtifactRetention
from collector.server.delivery_retention import DeliveryRetention
from collector.server.ledger import Ledger
from collector.server.store import segment_order, segment_path, write_segment

log = logging.getLogger(__name__)

WINDOW_INPUTS = ("comm", "timers", "rank_ends", "runs")  # what decides whether a window is ready
IDLE_RECHECK_S = 60.0


class Retention:
    def __init__(self, data_dir: Path, ledger: Ledger, config) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.ledger = ledger
        self.config = config  # CompactionConfig: raw_every, retention_window
        self.windows = 0
        # run -> last step whose window is wholly committed (rollup, analysis and thinning): the
        # rollup lands first, so a rolled-up step may still have its raw rows for a moment
        self.done_through: dict[str, int] = {}
        self.busy_s = 0.0  # wall time spent in windows (benches/health.py reports it)
        self._engine = duckdb.connect(":memory:", config={"threads": 1})
        self._catalog: Catalog | None = None  # opened on the first window (it makes D's catalog)
        # partition -> (its inputs' folder mtimes, when to look again) of a pass that found no window ready
        self._idle: dict[Path, tuple[tuple[int, ...], float]] = {}
        self._due: dict[Path, float] = {}  # partition -> seconds until its run counts as stalled (_stalled)
        self._hang_after: dict[str, float] = {}  # run -> its hang_after_s (collector.data.hang_rule)
        self.artifacts = ArtifactRetention(self.data_dir, ledger)  # thinned with raw steps (raw_every)
        self.deliveries = DeliveryRetention(self.data_dir, ledger)  # likewise

    def run(self, partition: Path, offline: bool = False) -> bool:
        """Roll up (and thin out) one window of ``partition`` (a comm run=<id> folder) if one is ready.
        ``offline``: D was written without a collector and is caught up at once (Compactor.catch_up),
        so how long a run has been quiet is judged by its records' own times alone."""
        if self.config.raw_every:
            self.artifacts.run(layout.run_of(partition))  # cheap unless its artifacts folder changed
        # A run whose folders have not changed since a pass found nothing to do is skipped: otherwise
        # every pass reads every footer of every run a data dir ever held (~4 ms a run). It is looked
        # at again after IDLE_RECHECK_S anyway, in case two changes fell in one mtime tick.
        state = self._inputs_state(layout.run_of(partition))
        idle = self._idle.get(partition)
        if idle is not None and idle[0] == state and time.monotonic() < idle[1]:
            return False
        t0 = time.perf_counter()
        try:
            did = self._run(partition, offline)
        finally:
            self.busy_s += time.perf_counter() - t0
        due = self._due.pop(partition, IDLE_RECHECK_S)  # a run that may stall before then: look again then
        if did:
            self._idle.pop(partition, None)
        else:
            self._idle[partition] = (state, time.monotonic() + min(IDLE_RECHECK_S, max(0.0, due)))
        return did

    def changed(self, run_ids: set[str]) -> None:
        """The runs whose collector-table rows compaction just folded into the shared partition (their
        folders' mtimes may look as before: a folder made and folded away between two passes)."""
        for run_id in run_ids:
            self._idle.pop(layout.partition_dir(self.data_dir, "comm", run_id), None)

    def _inputs_state(self, run_id: str) -> tuple[int, ...]:
        """The mtimes of the folders a window depends on (a segment added or swapped changes its folder's)."""
        out = []
        for table in WINDOW_INPUTS:
            try:
                out.append(layout.partition_dir(self.data_dir, table, run_id).stat().st_mtime_ns)
            except FileNotFoundError:
                out.append(0)
        return tuple(out)

    def _run(self, partition: Path, offline: bool) -> bool:
        run_id = layout.run_of(partition)
        through = self._rolled_through(run_id)
        stats = {p: _segment_stats(p) for p in self._segments(partition)}
        pending = [p for p, (_, hi, _) in stats.items() if hi > through]
        if not pending:
            return False
        world = self._world_size(run_id)
        if not world:
            return False  # no Hello yet: which ranks to wait for is unknown
        latest = self._latest_step_per_rank(pending)
        ended = set(range(world)) <= self._distinct_ranks("rank_ends", run_id)
        if ended:
            settled = max(latest.values())
        else:  # a rank that has not reported past ``through`` (or not at all yet) holds everything back
            settled = min(latest.get(r, through) for r in range(world)) - 1
            # A rank's timers of a step may land a flush after its next step's collectives: in a run
            # with step timers, a step settles once every rank's timers of it are stored too.
            timed = self._latest_step_per_rank(
                [p for p in self._files("timers", run_id) if _step_range(p)[1] > through]
            )
            if timed:
                settled = min(settled, min(timed.get(r, through) for r in range(world)))
        if settled <= through:
            return False
        short = settled - through < self.config.retention_window
        if short and not ended and not self._stalled(run_id, pending, offline):
            return False
        # Thinning rewrites whole segments, so it reads them whole; a rollup-only window is bounded
        # in rows and reads only its steps.
        step_in = None
        if not self.config.raw_every:
            settled = bounded_window([stats[p] for p in pending], through, settled, self.config.max_window_rows)
            step_in = [("step", ">", through), ("step", "<=", settled)]
        window = [p for p in pending if stats[p][0] <= settled]
        rows = pa.concat_tables([pq.read_table(p, filters=step_in) for p in window], promote_options="default")
        analysed = self._analysed_through(run_id)
        if settled > analysed:  # before the rollup: a crash between the two redoes this window's, never twice
            self._add(run_id, "unsettled_instances", self._unsettled(run_id, analysed, settled))
            self._add(run_id, "step_analysis", self._analysis(run_id, analysed, settled))  # marks the window done
        if self.config.raw_every:  # before the rollup lands: a window seen rolled up has its deliveries judged
            self.deliveries.run(self._catalog_of(), run_id, settled if ended else settled - DELIVERY_LAG_STEPS)
        rollup = window_rollup(self._engine, rows, through, settled)
        self._add(run_id, "comm_steps", rollup)
        if not self.config.raw_every:
            log.info("rollups %s: steps %d..%d rolled up and analysed", run_id, through + 1, settled)
            self.windows += 1
            self.done_through[run_id] = settled
            return True
        keep = steps_to_keep(rollup.to_pandas(), self.config.raw_every)
        step = rows.column("step")
        later = pc.fill_null(pc.greater(step, settled), False)  # a later window's to judge
        kept_steps = pa.array(sorted(keep), pa.int64())
        # rows of earlier windows were decided then; a row without a step stays
        mask = pc.or_kleene(pc.less_equal(step, through), pc.is_in(step, value_set=kept_steps))
        kept = rows.filter(pc.and_(pc.invert(later), pc.fill_null(pc.or_kleene(mask, pc.is_null(step)), True)))
        after = rows.filter(later)
        commit = self.ledger.reserve_commit()
        prefix = layout.segment_prefix("cmp", self.ledger.writer)
        outputs = []
        for table in (kept, after):
            if table.num_rows:
                outputs.append(segment_path(self.data_dir, "comm", run_id, prefix, commit, len(outputs)))
                write_segment(outputs[-1], table.schema, [table])
        self.ledger.commit_compaction(commit, window, outputs)
        log.info(
            "retention %s: steps %d..%d rolled up, raw rows kept for %d of them (%d of %d rows kept, %d past the "
            "window carried over)", run_id, through + 1, settled, len(keep), kept.num_rows,
            rows.num_rows - after.num_rows, after.num_rows,
        )  # fmt: skip
        self.windows += 1
        self.done_through[run_id] = settled
        return True

    def _stalled(self, run_id: str, pending: list[Path], offline: bool) -> bool:
        """Whether no rank of the run has entered a collective for its ``hang_after_s`` (collector.data.
        hang_rule): a hung run never fills a window (its stuck rank reports no later step), and every
        reader would analyse its whole unsettled tail from raw records on each look. Quiet since the
        newest record's start or (live) since a comm segment of the run last landed here, whichever
        is later. When not yet, when to look again is noted (``_due``)."""
        newest = max((_newest_start_ns(p) for p in pending), default=0)
        if not newest:
            return False
        if not offline:
            newest = max(newest, layout.partition_dir(self.data_dir, "comm", run_id).stat().st_mtime_ns)
        hang_after_s = self._hang_after.get(run_id)
        if hang_after_s is None:
            settings = self._rank_column("heartbeats", run_id, "hang_after_s")
            hang_after_s = hang_rule.threshold(settings)
            if settings:  # known once its ranks beat; until then it has none (never stalled)
                self._hang_after[run_id] = hang_after_s
        quiet_s = (time.time_ns() - newest) / 1e9
        if hang_rule.is_hung(quiet_s, hang_after_s):
            return True
        self._due[layout.partition_dir(self.data_dir, "comm", run_id)] = hang_after_s - quiet_s
        return False

    def _analysis(self, run_id: str, after: int, through: int) -> pa.Table:
        """queries.step_analysis's rows of the steps in (after, through], from the raw records."""
        frame = analyse_steps(self._catalog_of(), run_id, after=after, through=through)
        return pa.Table.from_pandas(frame, schema=STEP_ANALYSIS_SCHEMA, preserve_index=False)

    def _unsettled(self, run_id: str, after: int, through: int) -> pa.Table:
        """The completed rows of the window's instances that are odd or not whole (UNSETTLED_INSTANCES_SCHEMA)."""
        frame = unsettled_rows(self._catalog_of(), run_id, after, through)
        return pa.Table.from_pandas(frame, schema=UNSETTLED_INSTANCES_SCHEMA, preserve_index=False)

    def _catalog_of(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog(self.data_dir)
        return self._catalog

    def _add(self, run_id: str, table: str, rows: pa.Table) -> None:
        commit = self.ledger.reserve_commit()
        prefix = layout.segment_prefix("cmp", self.ledger.writer)
        final = segment_path(self.data_dir, table, run_id, prefix, commit)
        write_segment(final, layout.DERIVED_TABLES[table], [rows])
        self.ledger.commit_segments(commit, [final], {})

    def _analysed_through(self, run_id: str) -> int:
        return max((_step_range(p)[1] for p in self._files("step_analysis", run_id)), default=-1)

    def _segments(self, partition: Path) -> list[Path]:
        ours = [
            (order, p)
            for p in partition.glob(f"*{layout.SEGMENT_SUFFIX}")
            if (order := segment_order(p, self.ledger.writer)) is not None
        ]
        return [p for _, p in sorted(ours)]

    def _rolled_through(self, run_id: str) -> int:
        return max((_step_range(p)[1] for p in self._files("comm_steps", run_id)), default=-1)

    def _latest_step_per_rank(self, segments: list[Path]) -> dict[int, int]:
        if not segments:
            return {}
        cols = pa.concat_tables([pq.read_table(p, columns=["rank", "step"]) for p in segments])
        per = cols.group_by("rank").aggregate([("step", "max")])
        return dict(zip(per["rank"].to_pylist(), per["step_max"].to_pylist(), strict=True))

    def _world_size(self, run_id: str) -> int:
        return max((w for w in self._collector_column("runs", run_id, "world_size") if w is not None), default=0)

    def _files(self, table: str, run_id: str) -> list[Path]:
        part = layout.partition_dir(self.data_dir, table, run_id)
        return list(part.glob(f"*{layout.SEGMENT_SUFFIX}")) if part.is_dir() else []

    def _distinct_ranks(self, table: str, run_id: str) -> set[int]:
        return set(self._collector_column(table, run_id, "rank"))

    def _rank_column(self, table: str, run_id: str, column: str) -> list:
        """``column`` of ``run_id``'s rows of a per-rank table (NULLs left out)."""
        values = []
        for f in self._files(table, run_id):
            values += pq.read_table(f, columns=[column])[column].drop_null().to_pylist()
        return values

    def _collector_column(self, table: str, run_id: str, column: str) -> list:
        """``column`` of ``run_id``'s rows of a collector table: in its own partition, and in the
        shared one compaction folds them into (this thread's work, so no file goes meanwhile)."""
        values = []
        for f in self._files(table, run_id):
            values += pq.read_table(f, columns=[column])[column].to_pylist()
        for f in self._files(table, layout.SHARED_RUN):
            rows = pq.read_table(f, columns=["run_id", column], filters=[("run_id", "==", run_id)])
            values += rows[column].to_pylist()
        return values


def bounded_window(segments: list[tuple[int, int, int]], through: int, settled: int, max_rows: int) -> int:
    """The last step of a window after ``through`` that holds about ``max_rows`` raw rows at most
    (at least one step), estimated from each segment's (min step, max step, rows) with its rows
    spread evenly over its steps."""
    spans = [(lo, hi, rows / (hi - lo + 1)) for lo, hi, rows in segments if hi >= lo]
    end = settled
    while end > through + 1:
        rows = sum(per_step * max(0, min(hi, end) - max(lo, through + 1) + 1) for lo, hi, per_step in spans)
        if rows <= max_rows:
            break
        end = through + max(1, int((end - through) * max_rows / rows))  # fewer steps, in proportion
    return end


def _newest_start_ns(path: Path) -> int:
    """The latest ``start_ns`` of a comm segment, from its footer's statistics (0 if it has none)."""
    meta = pq.ParquetFile(path).metadata
    index = meta.schema.to_arrow_schema().get_field_index("start_ns")
    newest = 0
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(index).statistics
        if st is None or not st.has_min_max:
            return pc.max(pq.read_table(path, columns=["start_ns"])["start_ns"]).as_py() or 0
        newest = max(newest, st.max)
    return newest


def _step_range(path: Path) -> tuple[int, int]:
    """(min, max) step of a segment from its Parquet statistics; (0, -1) if it has no rows."""
    lo, hi, _ = _segment_stats(path)
    return lo, hi


def _segment_stats(path: Path) -> tuple[int, int, int]:
    """(min step, max step, rows) of a segment, from its footer."""
    meta = pq.ParquetFile(path).metadata
    index = meta.schema.to_arrow_schema().get_field_index("step")
    lo, hi = None, None
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(index).statistics
        if st is None or not st.has_min_max:
            table = pq.read_table(path, columns=["step"])["step"]
            return (pc.min(table).as_py() or 0, pc.max(table).as_py() or -1, meta.num_rows)
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
    return (0, -1, meta.num_rows) if lo is None else (int(lo), int(hi), meta.num_rows)
