"""Retention: thin out a run's raw comm records once their steps are settled, keeping a
per-step rollup of everything (``collect --raw-every N``; the policy is collector/data/retention.py).

Runs in the compaction thread, per comm partition, on a window of *settled* steps: steps
every rank has moved past (each rank reported a later step) or, once the run ended, all of
them -- an instance's arrival delays need every rank's record, so a step is rolled up only
when no more of its records can come. The window starts after the last rolled-up step (the
max step of the run's ``comm_steps``) and is processed once it holds ``retention_window``
steps, or when the run has ended.

One pass, two ledger commits, in this order:

1. the window's rollup (collector.data.queries.rollup_sql over the raw rows) is added as a
   ``comm_steps`` segment;
2. the comm segments holding rows of the window are replaced (as one compaction) by a segment
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
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collector.data import layout
from collector.data.queries import rollup_sql
from collector.data.retention import steps_to_keep
from collector.data.schema import COMM_STEPS_SCHEMA
from collector.server.ledger import Ledger
from collector.server.store import segment_order, segment_path, write_segment

log = logging.getLogger(__name__)

ROLLUP_INPUT = "SELECT rank, step, group_name, seq, op, bytes, start_ns, end_ns, algbw_gbs, busbw_gbs FROM raw"


class Retention:
    def __init__(self, data_dir: Path, ledger: Ledger, config) -> None:
        self.data_dir = Path(data_dir)
        self.ledger = ledger
        self.config = config  # CompactionConfig: raw_every, retention_window
        self.windows = 0
        self._engine = duckdb.connect(":memory:", config={"threads": 1})

    def run(self, partition: Path) -> bool:
        """Thin out one window of ``partition`` (a comm run=<id> folder) if one is ready."""
        run_id = layout.run_of(partition)
        through = self._rolled_through(run_id)
        stats = {p: _step_range(p) for p in self._segments(partition)}
        pending = [p for p, (_, hi) in stats.items() if hi > through]
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
        if settled <= through or (settled - through < self.config.retention_window and not ended):
            return False
        window = [p for p in pending if stats[p][0] <= settled]
        rows = pa.concat_tables([pq.read_table(p) for p in window], promote_options="default")
        rollup = self._rollup(rows, through, settled)
        self._add_rollup(run_id, rollup)
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
        return True

    def _rollup(self, raw: pa.Table, through: int, settled: int) -> pa.Table:
        cur = self._engine.cursor()
        try:
            cur.register("raw", raw)
            sql = rollup_sql(ROLLUP_INPUT + " WHERE step > ? AND step <= ?")
            rows = cur.sql(f"SELECT * FROM ({sql}) ORDER BY step, rank", params=[through, settled]).to_arrow_table()
        finally:
            cur.close()
        return rows.select(COMM_STEPS_SCHEMA.names).cast(COMM_STEPS_SCHEMA)

    def _add_rollup(self, run_id: str, rollup: pa.Table) -> None:
        commit = self.ledger.reserve_commit()
        prefix = layout.segment_prefix("cmp", self.ledger.writer)
        final = segment_path(self.data_dir, "comm_steps", run_id, prefix, commit)
        write_segment(final, COMM_STEPS_SCHEMA, [rollup])
        self.ledger.commit_segments(commit, [final], {})

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
        cols = pa.concat_tables([pq.read_table(p, columns=["rank", "step"]) for p in segments])
        per = cols.group_by("rank").aggregate([("step", "max")])
        return dict(zip(per["rank"].to_pylist(), per["step_max"].to_pylist(), strict=True))

    def _world_size(self, run_id: str) -> int:
        files = self._files("runs", run_id)
        return max(
            (w for f in files for w in pq.read_table(f, columns=["world_size"])["world_size"].to_pylist()), default=0
        )

    def _files(self, table: str, run_id: str) -> list[Path]:
        part = layout.partition_dir(self.data_dir, table, run_id)
        return list(part.glob(f"*{layout.SEGMENT_SUFFIX}")) if part.is_dir() else []

    def _distinct_ranks(self, table: str, run_id: str) -> set[int]:
        return {r for f in self._files(table, run_id) for r in pq.read_table(f, columns=["rank"])["rank"].to_pylist()}


def _step_range(path: Path) -> tuple[int, int]:
    """(min, max) step of a segment from its Parquet statistics; (0, -1) if it has no rows."""
    meta = pq.ParquetFile(path).metadata
    index = meta.schema.to_arrow_schema().get_field_index("step")
    lo, hi = None, None
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(index).statistics
        if st is None or not st.has_min_max:
            table = pq.read_table(path, columns=["step"])["step"]
            return (pc.min(table).as_py() or 0, pc.max(table).as_py() or -1)
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
    return (0, -1) if lo is None else (int(lo), int(hi))
