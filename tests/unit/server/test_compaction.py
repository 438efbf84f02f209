"""Compaction policy and merges: sizes, order, schema evolution, repeated merges."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collector.data import catalog
from collector.data.codec import decode_batch, encode_batch
from collector.server.compaction import CompactionConfig, Compactor, pick_inputs
from collector.server.store import Store, StoreConfig
from collector.testing.fake_runs import comm_columns

CFG = CompactionConfig(min_files=4, target_bytes=1000, max_files=6)


def sizes(*bytes_: int) -> list[tuple[Path, int]]:
    return [(Path(f"seg-{i:010d}-0.parquet"), b) for i, b in enumerate(bytes_)]


def names(paths: list[Path]) -> list[int]:
    return [int(p.stem.split("-")[1]) for p in paths]


def test_pick_takes_the_oldest_small_segments_up_to_the_target():
    assert names(pick_inputs(sizes(100, 100, 100, 100, 100), CFG)) == [0, 1, 2, 3, 4]
    assert names(pick_inputs(sizes(*[100] * 10), CFG)) == [0, 1, 2, 3, 4, 5]  # max_files
    assert names(pick_inputs(sizes(400, 400, 400, 100), CFG)) == [0, 1]  # about one target's worth
    assert pick_inputs(sizes(100, 100, 100), CFG) == []  # too few, too small: wait for more
    assert names(pick_inputs(sizes(5000, 100, 100, 100, 100), CFG)) == [1, 2, 3, 4]  # big ones stay


def commit_batches(data: Path, batches: int, rows: int) -> Store:
    store = Store(data, StoreConfig(flush_interval=0.01))
    for seq in range(1, batches + 1):
        table = decode_batch(encode_batch("comm", "r", 0, comm_columns(0, seq * rows, rows)))
        store.submit("c", seq, [("comm", "r", table)], lambda err: None)
        store.flush()
    return store


def test_repeated_scans_shrink_many_segments_to_few_and_keep_every_row(tmp_path):
    store = commit_batches(tmp_path, 40, 50)
    partition = tmp_path / "parquet" / "comm" / "run=r"
    assert len(list(partition.glob("*.parquet"))) == 40
    compactor = Compactor(tmp_path, store.ledger, CompactionConfig(min_files=4, target_bytes=1 << 30))
    assert compactor.run_once() >= 1
    files = list(partition.glob("*.parquet"))
    assert len(files) == 1
    seqs = pq.read_table(files[0])["seq"].to_pylist()
    assert seqs == list(range(50, 41 * 50))  # merged in commit order
    store.close()


def test_merging_segments_from_before_a_new_column_fills_it_with_nulls(tmp_path):
    store = commit_batches(tmp_path, 3, 10)
    partition = tmp_path / "parquet" / "comm" / "run=r"
    # an older collector's segment, without the later columns
    old = pa.table({"rank": pa.array([7], pa.int64()), "step": pa.array([1], pa.int64())})
    pq.write_table(old, partition / "seg-0000000000-0.parquet")
    foreign = partition / "from-git.parquet"  # not the store's: never merged or deleted
    pq.write_table(old, foreign)
    Compactor(tmp_path, store.ledger, CompactionConfig(min_files=4)).run_once()
    store.close()
    (merged,) = partition.glob("cmp-*.parquet")
    assert foreign.exists()
    foreign.unlink()
    table = pq.read_table(merged)
    assert table.num_rows == 31 and "busbw_gbs" in table.column_names
    con = catalog.connect(tmp_path)
    assert con.execute("SELECT count(*) FROM comm WHERE op IS NULL AND rank = 7").fetchone() == (1,)
    assert con.execute("SELECT count(*) FROM comm").fetchone() == (31,)


def test_settings_that_cannot_work_are_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"^compaction\.max_files: must be >= compaction\.min_files \(8\) \(got 4\)$"):
        CompactionConfig(max_files=4)
    with pytest.raises(ValueError, match=r"^compaction\.target_bytes: must be >= 1 \(got 0\)$"):
        CompactionConfig(target_bytes=0)
    with pytest.raises(
        ValueError,
        match=r"^store\.max_buffered_bytes: must be >= store\.flush_bytes \(1024\) "
        r"\(got 512\)$",
    ):
        StoreConfig(flush_bytes=1024, max_buffered_bytes=512)
    assert StoreConfig(flush_interval=1).flush_interval == 1.0


def test_a_merge_swaps_the_readers_list_at_once_and_deletes_the_inputs_only_later(tmp_path):
    store = commit_batches(tmp_path, 6, 10)
    before = catalog.snapshot_files(tmp_path)["comm"]
    assert len(before) == 6 and all(f.startswith("snapshot/comm/run=r/seg-") for f in before)
    Compactor(tmp_path, store.ledger, CompactionConfig(min_files=4)).run_once()
    (after,) = catalog.snapshot_files(tmp_path)["comm"]
    assert after.startswith("snapshot/comm/run=r/cmp-")
    assert [p.name for p in (tmp_path / "parquet" / "comm" / "run=r").glob("*.parquet")] == [after.split("/")[-1]]
    # a reader that took the list before the merge still reads every file of it, the same rows
    con = catalog.connect(tmp_path)
    assert con.execute("SELECT count(*), count(DISTINCT seq) FROM read_parquet(?)", [before]).fetchone() == (60, 60)
    con.close()
    assert store.ledger.collect_garbage(60) == 0  # within the grace period: kept
    assert store.ledger.collect_garbage(0) == 6
    assert not any((tmp_path / f).exists() for f in before)
    store.close()


def test_links_left_by_a_collector_that_stopped_are_retired_at_the_next_start(tmp_path):
    store = commit_batches(tmp_path, 6, 10)
    before = catalog.snapshot_files(tmp_path)["comm"]
    Compactor(tmp_path, store.ledger, CompactionConfig(min_files=4)).run_once()
    store.close()  # within the grace period: the inputs' links stay
    assert all((tmp_path / f).exists() for f in before)
    again = Store(tmp_path)
    (after,) = catalog.snapshot_files(tmp_path)["comm"]
    assert after.startswith("snapshot/comm/run=r/cmp-")
    assert again.ledger.collect_garbage(0) == 6
    assert catalog.connect(tmp_path).execute("SELECT count(*) FROM comm").fetchone() == (60,)
    again.close()


def test_a_data_dir_without_a_manifest_is_read_by_listing_its_partitions(tmp_path):
    store = commit_batches(tmp_path, 3, 10)
    store.close()
    (tmp_path / "ledger" / "manifest.json").unlink()  # as a collector before manifests left it
    assert catalog.snapshot_files(tmp_path) is None
    assert catalog.connect(tmp_path).execute("SELECT count(*) FROM comm").fetchone() == (30,)
    assert catalog.run_readonly_query(tmp_path, "SELECT count(*) AS n FROM comm")["n"][0].as_py() == 30
