"""Retention of telemetry arrival times (``collect --raw-every N``): a run's ``deliveries`` rows
(one per rank per flush) outside its slow-link findings' steps are removed, as raw comm records of
unremarkable steps are (the policy: collector.data.retention.deliveries_kept).

Run by collector.server.retention at each window of a run, before the window's rollup lands (the
compaction thread, so nothing else rewrites the run's ``deliveries`` segments meanwhile): whoever
sees a window rolled up sees the deliveries up to it judged. The slow-link findings are the run's as
``rankscope health`` finds them on the steps stored so far (without the step times, whose share
only ever drops a finding: a few more rows kept, never fewer). Rows are judged once, by their step:
those after the last judged step and up to ``through``; rows past ``through`` are copied into a
segment of their own, as they were, for a later pass; a row without a step stays. The run's
segments this writer owns that hold judged rows are replaced in one ledger record (a crash leaves
the old rows or the new). A segment the store lands meanwhile is not an input; a row that lands
after its step was judged stays.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collector.data import layout, queries
from collector.data.calibration import load as load_calibration
from collector.data.findings.links import MIN_BYTES, slow_links
from collector.data.retention import deliveries_kept
from collector.server.ledger import Ledger
from collector.server.store import segment_order, segment_path, write_segment

log = logging.getLogger(__name__)


class DeliveryRetention:
    def __init__(self, data_dir: Path, ledger: Ledger) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.ledger = ledger
        self.judged: dict[str, int] = {}  # run -> the last step whose deliveries were judged
        self.removed_rows = 0

    def run(self, cat: queries.Catalog, run_id: str, through: int) -> int:
        """Judge ``run_id``'s deliveries of the steps up to ``through``; how many rows were removed."""
        after = self.judged.get(run_id, -1)
        if through <= after:
            return 0
        segments = [p for p in self._segments(run_id) if _holds_steps(p, after, through)]
        removed = self._thin(cat, run_id, segments, after, through) if segments else 0
        self.judged[run_id] = through
        return removed

    def _thin(self, cat: queries.Catalog, run_id: str, segments: list[Path], after: int, through: int) -> int:
        rows = pa.concat_tables([pq.read_table(p) for p in segments], promote_options="default")
        step = rows.column("step")
        judged = pc.fill_null(pc.and_(pc.greater(step, after), pc.less_equal(step, through)), False)
        judged_steps = step.filter(judged).to_numpy()
        stays = deliveries_kept(judged_steps, slow_link_steps(cat, run_id))
        if stays.all():
            return 0
        keep = np.ones(rows.num_rows, dtype=bool)
        keep[np.flatnonzero(judged.to_numpy(zero_copy_only=False))] = stays
        later = pc.fill_null(pc.greater(step, through), False)
        kept = rows.filter(pc.and_(pa.array(keep), pc.invert(later)))
        past = rows.filter(later)
        commit = self.ledger.reserve_commit()
        prefix = layout.segment_prefix("cmp", self.ledger.writer)
        outputs = []
        for table in (kept, past):
            if table.num_rows:
                outputs.append(segment_path(self.data_dir, "deliveries", run_id, prefix, commit, len(outputs)))
                write_segment(outputs[-1], table.schema, [table])
        self.ledger.commit_compaction(commit, segments, outputs)
        removed = len(stays) - int(stays.sum())
        self.removed_rows += removed
        log.info(
            "delivery retention %s: steps %d..%d judged, %d of %d rows kept (near slow-link findings)",
            run_id, after + 1, through, int(stays.sum()), len(stays),
        )  # fmt: skip
        return removed

    def _segments(self, run_id: str) -> list[Path]:
        partition = layout.partition_dir(self.data_dir, "deliveries", run_id)
        if not partition.is_dir():
            return []
        ours = [(segment_order(p, self.ledger.writer), p) for p in partition.glob(f"*{layout.SEGMENT_SUFFIX}")]
        return [p for order, p in sorted(o for o in ours if o[0] is not None)]


def slow_link_steps(cat: queries.Catalog, run_id: str) -> list[tuple[int, int]]:
    """The (first, last) steps of the run's slow-link findings on what D holds now (none on one host)."""
    ranks = queries.ranks(cat, run_id)
    hosts = ranks.host.dropna().unique()
    if len(hosts) < 2:
        return []
    rollup = queries.comm_rollup(cat, run_id)
    found = slow_links(
        queries.link_transfers(rollup, MIN_BYTES),
        queries.group_members(rollup),
        ranks,
        calibration=load_calibration(cat.data_dir, hosts),
    )
    return [f.steps for f in found if f.steps is not None]


def _holds_steps(path: Path, after: int, through: int) -> bool:
    """Whether a deliveries segment may hold rows of steps in (after, through], from its footer."""
    meta = pq.ParquetFile(path).metadata
    index = meta.schema.to_arrow_schema().get_field_index("step")
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(index).statistics
        if st is None or not st.has_min_max:
            if st is not None and st.null_count == meta.row_group(g).num_rows:
                continue  # no step at all: nothing to judge
            return True  # no statistics: read it to know
        if st.max > after and st.min <= through:
            return True
    return False
