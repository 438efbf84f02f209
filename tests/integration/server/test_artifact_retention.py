"""Captured evidence thinned with raw steps (collector.server.artifact_retention): a real
collector with ``--raw-every`` keeps the rows and files of a run's newest
ARTIFACT_REQUESTS_KEPT requests and removes the older ones' (rows rewritten through the ledger,
files deleted after); without ``--raw-every`` every capture stays. The policy itself:
tests/unit/server/test_retention.py."""

from __future__ import annotations

import gzip

import pytest

from collector.data import queries
from collector.data.retention import ARTIFACT_REQUESTS_KEPT
from collector.server.compaction import CompactionConfig
from collector.testing.collectors import live_collector
from collector.testing.fake_runs.envelopes import comm_envelope, envelope, hello, run_end
from collector.testing.streams import RawStream
from proto import pb

RUN, EXTRA = "run-art", 3
REQUESTS = ARTIFACT_REQUESTS_KEPT + EXTRA


def _stream_captures(collector) -> None:
    """Rank 0 of a 1-rank run: some comm records (so retention visits the run), then one captured
    trace per request, oldest first (each stored row is dated on arrival)."""
    stream = RawStream(collector.channel())
    envelopes = [hello("r0", 1, RUN, 0, 1), comm_envelope("r0", 2, RUN, 0, 0, 10, group_size=1)]
    for i in range(REQUESTS):
        trace = gzip.compress(b'{"traceEvents": [], "n": %d}' % i)
        artifact = pb.Artifact(
            run_id=RUN, rank=0, request_id=f"profile-{i:03d}", kind="profile", first_step=i, last_step=i, data=trace
        )
        envelopes.append(envelope("r0", 3 + i, artifact=artifact))
    envelopes.append(run_end("r0", 3 + REQUESTS, RUN, 0))  # ended: its steps settle, retention visits it
    stream.send(*envelopes)  # handled in order: each row is dated later than the one before
    stream.finish()
    assert stream.acked == set(range(1, len(envelopes) + 1)), stream.error


def _request_ids(data_dir) -> list[str]:
    cat = queries.Catalog(data_dir)
    try:
        return sorted(cat.df("select request_id from artifacts where run_id = ?", [RUN]).request_id)
    finally:
        cat.close()


def _files(data_dir) -> list[str]:
    return sorted(p.name.split("-rank")[0] for p in (data_dir / f"artifacts/run={RUN}").glob("*.json.gz"))


@pytest.mark.parametrize("raw_every", [5, 0])
def test_old_captures_go_with_raw_steps_and_stay_without_retention(tmp_path, raw_every):
    data_dir = tmp_path / "data"
    config = CompactionConfig(interval=3600, raw_every=raw_every, retention_window=5)  # passes: compact_until
    newest = [f"profile-{i:03d}" for i in range(EXTRA, REQUESTS)]
    everything = [f"profile-{i:03d}" for i in range(REQUESTS)]
    with live_collector(data_dir, compaction_config=config) as collector:
        _stream_captures(collector)
        assert len(_files(data_dir)) == REQUESTS  # each written at intake
        thinning = collector.state.compactor.retention.artifacts
        if raw_every:
            collector.compact_until(lambda: thinning.removed_files >= EXTRA, "the removal of old artifacts")
        else:  # a baseline in the same test: retention has rolled the run up, and left artifacts alone
            retention = collector.state.compactor.retention
            collector.compact_until(lambda: retention.done_through.get(RUN, -1) >= 0, "the run's rollup")
            assert thinning.removed_files == 0
    expected = newest if raw_every else everything
    assert _request_ids(data_dir) == expected
    assert _files(data_dir) == expected
