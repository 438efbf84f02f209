"""Retention of captured evidence (``collect --raw-every N``): the ``artifacts`` rows and files of
a run's requests beyond the newest ``kept`` (collector.data.retention.artifact_requests_to_drop)
are removed, as raw comm records of unremarkable steps are.

Run by collector.server.retention at each pass over a run (the compaction thread, so nothing else
rewrites the run's ``artifacts`` segments meanwhile), and only when that run's ``artifacts`` folder
changed since the last look. The rows are rewritten as thinning rewrites comm segments: the run's
segments this writer owns are replaced in one ledger record by one segment without the dropped
requests' rows (a crash leaves the old rows or the new). The files go after that commit, so no
row ever names a missing file; a crash between the two leaves files no row names (disk, not a
wrong answer). A segment the store lands meanwhile is not an input and stays as it is.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collector.data import layout
from collector.data.retention import ARTIFACT_REQUESTS_KEPT, artifact_requests_to_drop
from collector.server.artifacts import ARTIFACTS_DIR
from collector.server.ledger import Ledger
from collector.server.store import segment_order, segment_path, write_segment

log = logging.getLogger(__name__)


class ArtifactRetention:
    def __init__(self, data_dir: Path, ledger: Ledger, kept: int = ARTIFACT_REQUESTS_KEPT) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.ledger, self.kept = ledger, kept
        self._looked: dict[str, int] = {}  # run -> its artifacts folder's mtime when last thinned
        self.removed_files = 0

    def run(self, run_id: str) -> int:
        """Thin one run's artifacts if its folder changed; how many requests were removed."""
        partition = layout.partition_dir(self.data_dir, "artifacts", run_id)
        try:
            mtime = partition.stat().st_mtime_ns
        except FileNotFoundError:
            return 0
        if self._looked.get(run_id) == mtime:
            return 0
        ours = [(segment_order(p, self.ledger.writer), p) for p in partition.glob(f"*{layout.SEGMENT_SUFFIX}")]
        segments = [p for order, p in sorted(o for o in ours if o[0] is not None)]
        dropped = self._thin(run_id, segments) if segments else 0
        self._looked[run_id] = partition.stat().st_mtime_ns
        return dropped

    def _thin(self, run_id: str, segments: list[Path]) -> int:
        rows = pa.concat_tables([pq.read_table(p) for p in segments], promote_options="default")
        drop = artifact_requests_to_drop(rows.select(["request_id", "time_ns"]).to_pandas(), self.kept)
        if not drop:
            return 0
        gone = pc.is_in(rows.column("request_id"), value_set=pa.array(sorted(drop), pa.string()))
        kept = rows.filter(pc.invert(gone))
        files = [p for p in rows.filter(gone).column("path").to_pylist() if p]
        commit = self.ledger.reserve_commit()
        outputs = []
        if kept.num_rows:
            prefix = layout.segment_prefix("cmp", self.ledger.writer)
            outputs.append(segment_path(self.data_dir, "artifacts", run_id, prefix, commit))
            write_segment(outputs[0], kept.schema, [kept])
        self.ledger.commit_compaction(commit, segments, outputs)
        root = (self.data_dir / ARTIFACTS_DIR).resolve()
        for name in files:
            path = (self.data_dir / name).resolve()
            if not path.is_relative_to(root):  # a row names only files under D/artifacts/
                log.warning("artifact retention: %s is not under %s; left alone", name, root)
                continue
            path.unlink(missing_ok=True)
            self.removed_files += 1
        log.info(
            "artifact retention %s: %d request(s) beyond the newest %d removed (%d rows, %d files)",
            run_id, len(drop), self.kept, rows.num_rows - kept.num_rows, len(files),
        )  # fmt: skip
        return len(drop)
