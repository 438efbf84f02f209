"""Crash recovery of the store's commit log, one crash point at a time.

A crash right after a commit point is simulated by making ``_apply`` (the
renames that follow the fsync'd ledger record) do nothing, then opening the data
dir again as a restarted collector would."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collector.data import layout
from collector.server import ledger as ledger_module
from collector.server.ledger import Ledger, SeqSet
from collector.server.store import segment_path, write_segment

SCHEMA = pa.schema([("rank", pa.int64()), ("step", pa.int64())])


def rows(first: int, n: int) -> pa.Table:
    return pa.table({"rank": [0] * n, "step": list(range(first, first + n))}, schema=SCHEMA)


def committed_segment(led: Ledger, data, first: int, n: int, acked=None):
    commit = led.reserve_commit()
    final = segment_path(data, "timers", "r", "seg", commit)
    write_segment(final, SCHEMA, [rows(first, n)])
    led.commit_segments(commit, [final], acked or {})
    return final


def crash_after_commit_point(led: Ledger, monkeypatch) -> None:
    monkeypatch.setattr(led, "_apply", lambda record: None)


def visible_steps(data) -> list[int]:
    files = sorted((data / "parquet" / "timers" / "run=r").glob("*.parquet"))
    return sorted(s for f in files for s in pq.read_table(f)["step"].to_pylist())


def temps(data) -> list:
    return list((data / "parquet").rglob(f"*{layout.TEMP_SUFFIX}"))


def test_committed_segments_left_under_temporary_names_are_rolled_forward(tmp_path, monkeypatch):
    led = Ledger(tmp_path)
    committed_segment(led, tmp_path, 0, 5, {"a": [1]})
    crash_after_commit_point(led, monkeypatch)
    final = committed_segment(led, tmp_path, 5, 5, {"a": [2, 3]})
    assert not final.exists() and layout.temp_name(final).exists()
    led.close()

    again = Ledger(tmp_path)
    assert final.exists() and temps(tmp_path) == []
    assert visible_steps(tmp_path) == list(range(10))
    assert all(again.is_durable("a", s) for s in (1, 2, 3)) and not again.is_durable("a", 4)


def test_segments_written_but_never_committed_are_deleted_and_not_durable(tmp_path):
    led = Ledger(tmp_path)
    committed_segment(led, tmp_path, 0, 5, {"a": [1]})
    orphan = segment_path(tmp_path, "timers", "r", "seg", led.reserve_commit())
    write_segment(orphan, SCHEMA, [rows(5, 5)])  # the crash came before the ledger record
    led.close()

    again = Ledger(tmp_path)
    assert temps(tmp_path) == [] and not orphan.exists()
    assert visible_steps(tmp_path) == list(range(5))
    assert again.is_durable("a", 1) and not again.is_durable("a", 2)


def test_a_torn_last_record_is_cut_off_so_later_commits_are_not_hidden(tmp_path):
    led = Ledger(tmp_path)
    committed_segment(led, tmp_path, 0, 5, {"a": [1]})
    log = led._log_path(led._gen)
    led.close()
    with open(log, "ab") as f:
        f.write(b'1234abcd {"commit": 99, "add": ["parq')  # killed mid-append

    again = Ledger(tmp_path)
    assert again.is_durable("a", 1) and again.reserve_commit() < 99
    committed_segment(again, tmp_path, 5, 5, {"a": [2]})
    again.close()
    third = Ledger(tmp_path)
    assert third.is_durable("a", 1) and third.is_durable("a", 2)
    assert visible_steps(tmp_path) == list(range(10))


def test_a_compaction_interrupted_after_its_commit_is_finished_on_restart(tmp_path, monkeypatch):
    led = Ledger(tmp_path)
    inputs = [committed_segment(led, tmp_path, i * 5, 5) for i in range(3)]
    commit = led.reserve_commit()
    output = segment_path(tmp_path, "timers", "r", "cmp", commit)
    write_segment(output, SCHEMA, [pq.read_table(p) for p in inputs])
    crash_after_commit_point(led, monkeypatch)
    led.commit_compaction(commit, inputs, [output])
    inputs[0].unlink()  # the crash came after the first unlink
    led.close()

    Ledger(tmp_path)
    assert [p.exists() for p in inputs] == [False] * 3 and output.exists()
    assert visible_steps(tmp_path) == list(range(15))


def test_a_compaction_interrupted_before_its_commit_is_rolled_back(tmp_path):
    led = Ledger(tmp_path)
    inputs = [committed_segment(led, tmp_path, i * 5, 5) for i in range(3)]
    output = segment_path(tmp_path, "timers", "r", "cmp", led.reserve_commit())
    write_segment(output, SCHEMA, [pq.read_table(p) for p in inputs])
    led.close()

    Ledger(tmp_path)
    assert all(p.exists() for p in inputs) and not output.exists() and temps(tmp_path) == []
    assert visible_steps(tmp_path) == list(range(15))


def test_the_log_is_folded_into_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_module, "CHECKPOINT_EVERY", 5)
    led = Ledger(tmp_path)
    for seq in range(1, 24):
        committed_segment(led, tmp_path, seq, 1, {"a": [seq], f"b{seq % 3}": [seq]})
    assert led._records_in_log < 5
    led.close()
    again = Ledger(tmp_path)
    assert sorted(p.name for p in (tmp_path / "ledger").iterdir()) == [
        f"checkpoint-{again._gen}.json",
        f"log-{again._gen}.jsonl",
        "manifest.json",  # what readers read (collector.data.catalog.snapshot_files)
        "owner.lock",
    ]
    assert all(again.is_durable("a", s) for s in range(1, 24)) and not again.is_durable("a", 24)
    assert again.is_durable("b2", 23) and not again.is_durable("b2", 22)
    assert again.reserve_commit() > 23


def test_a_second_ledger_on_the_same_dir_is_refused(tmp_path):
    led = Ledger(tmp_path)
    with pytest.raises(ledger_module.DataDirBusy):
        Ledger(tmp_path)
    led.close()
    Ledger(tmp_path).close()


def test_seq_set_tracks_out_of_order_arrivals_and_gaps_as_ranges():
    s = SeqSet()
    for seq in (3, 1, 5):
        s.add(seq)
    assert s.ranges == [[1, 1], [3, 3], [5, 5]]
    s.add(2)
    s.add(4)
    assert s.ranges == [[1, 5]]
    assert 4 in s and 6 not in s and 0 not in s
    # a seq skipped for good: everything after it still costs a single range
    for seq in range(7, 10_000):
        s.add(seq)
    assert s.ranges == [[1, 5], [7, 9999]] and 6 not in s and 9999 in s
    s.add_range(2, 20_000)
    assert s.ranges == [[1, 20_000]]
    assert SeqSet([[5, 9], [1, 2], [3, 4]]).ranges == [[1, 9]]


def test_seq_set_matches_a_plain_set():
    import random

    rng = random.Random(7)
    s, plain = SeqSet(), set()
    for _ in range(2000):
        lo = rng.randint(1, 500)
        hi = lo + rng.choice([0, 0, 0, 1, 5])
        s.add_range(lo, hi)
        plain.update(range(lo, hi + 1))
    assert all((seq in s) == (seq in plain) for seq in range(0, 520))
    assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(s.ranges))  # disjoint, not touching
