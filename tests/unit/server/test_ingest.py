"""The collector over a real gRPC channel: exact counts, dedupe, ack-after-durable.

Split by tier: what needs processes, sockets or seconds is in tests/integration/server/test_ingest.py."""

from __future__ import annotations

import pyarrow.parquet as pq

from collector.server.store import StoreConfig
from collector.testing.fake_runs import comm_columns


def test_a_big_commit_is_split_over_two_segments(tmp_path):
    from collector.data.codec import decode_batch, encode_batch
    from collector.server.store import SPLIT_ROWS, Store

    store = Store(tmp_path, StoreConfig(flush_interval=5))
    per_chunk = SPLIT_ROWS // 3 + 1
    for seq in range(1, 5):
        rows = decode_batch(encode_batch("comm", "r", 0, comm_columns(0, seq * per_chunk, per_chunk)))
        store.submit("c", seq, [("comm", "r", rows)], lambda err: None)
    store.flush()
    store.close()
    files = sorted((tmp_path / "parquet" / "comm" / "run=r").glob("*.parquet"))
    assert [f.name for f in files] == ["seg-0000000001-0.parquet", "seg-0000000001-1.parquet"]
    seqs = sorted(s for f in files for s in pq.read_table(f)["seq"].to_pylist())
    assert seqs == list(range(per_chunk, 5 * per_chunk))
