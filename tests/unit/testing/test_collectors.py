"""collector.testing's plumbing: a live collector that really listens, stores and stops
(and unpacks as (endpoint, data_dir)), the raw stream driving it, stored_rows counting
committed segments without the catalog, and free ports that really are free.

Split by tier: what needs processes, sockets or seconds is in tests/integration/testing/test_collectors.py."""

from __future__ import annotations

from collector.testing.collectors import stored_rows


def test_stored_rows_counts_committed_segments_only(tmp_path):
    assert stored_rows(tmp_path) == 0
    part = tmp_path / "parquet" / "comm" / "run=x"
    part.mkdir(parents=True)
    (part / ".seg-1.parquet.tmp").write_bytes(b"half written")  # a temporary name is not a segment
    assert stored_rows(tmp_path) == 0
