"""A truncated segment and a bit-flipped one in a live data dir: before the collector gets to
them, readers skip (or name) them instead of failing unrelated queries; the compactor then
moves both to D/quarantine/ with one log line each naming the file and why, and goes on
compacting every other partition."""

from __future__ import annotations

import logging
import warnings

import pytest

from collector.data import catalog, layout
from collector.server.compaction import CompactionConfig
from collector.testing.collectors import live_collector
from collector.testing.fake_runs import comm_envelope
from collector.testing.streams import RawStream

SEGMENTS, ROWS = 4, 50


def _stream_segments(live, run_id: str) -> None:
    s = RawStream(live.channel())
    for seq in range(1, SEGMENTS + 1):  # acked one by one: one committed segment each
        s.send(comm_envelope(f"c-{run_id}", seq, run_id, 0, seq * ROWS, ROWS))
        assert s.wait_acked([seq])
    s.finish()


def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip(path) -> None:
    # every byte of the page data (between the leading magic and the footer): the footer still reads
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for i in range(4, len(data) - footer):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _count(data_dir, run_id: str) -> int:
    table = catalog.run_readonly_query(data_dir, f"SELECT count(*) AS n FROM comm WHERE run_id = '{run_id}'")
    return table["n"][0].as_py()


@pytest.fixture
def live(tmp_path):
    # compaction off until the corrupt files are in place, then every 0.2 s
    with live_collector(tmp_path / "data", compaction_config=CompactionConfig(interval=3600, min_files=2)) as live:
        yield live


def test_corrupt_segments_are_skipped_then_quarantined_and_compaction_goes_on(live, caplog):
    for run_id in ("bad", "good"):
        _stream_segments(live, run_id)
    bad = sorted(layout.partition_dir(live.data_dir, "comm", "bad").glob("*.parquet"))
    truncated, flipped = bad[0], bad[1]
    _truncate(truncated)
    _flip(flipped)

    # Readers: the truncated one is skipped with a warning naming it; other runs and tables answer.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _count(live.data_dir, "good") == SEGMENTS * ROWS
        assert catalog.run_readonly_query(live.data_dir, "SELECT 1 AS one")["one"][0].as_py() == 1
        assert catalog.run_readonly_query(live.data_dir, "SELECT count(*) AS n FROM runs")["n"][0].as_py() >= 0
    assert any(str(truncated) in str(w.message) for w in seen), [str(w.message) for w in seen]

    caplog.set_level(logging.WARNING, logger="collector.server.compaction")
    live.state.compactor.config = CompactionConfig(interval=3600, min_files=2)
    for _ in range(3):  # the first pass quarantines, the next merges what is left
        live.state.compactor.run_once()

    quarantine = live.data_dir / layout.QUARANTINE_DIR / "comm" / "run=bad"
    assert sorted(p.name for p in quarantine.iterdir()) == sorted([truncated.name, flipped.name])
    lines = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert len(lines) == 2, lines
    assert any(truncated.name in line for line in lines) and any(flipped.name in line for line in lines)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

    # compaction carried on: both runs' partitions are merged, nothing of the good run lost
    for run_id in ("bad", "good"):
        names = [p.name for p in layout.partition_dir(live.data_dir, "comm", run_id).glob("*.parquet")]
        assert len(names) == 1 and names[0].startswith("cmp-"), names
    assert _count(live.data_dir, "good") == SEGMENTS * ROWS
    assert _count(live.data_dir, "bad") == (SEGMENTS - 2) * ROWS


def test_a_bit_flipped_segment_is_named_in_the_query_error(live):
    _stream_segments(live, "flip")
    segment = sorted(layout.partition_dir(live.data_dir, "comm", "flip").glob("*.parquet"))[0]
    _flip(segment)
    with pytest.raises(catalog.QueryError) as info:
        catalog.run_readonly_query(live.data_dir, "SELECT * FROM comm WHERE run_id = 'flip'")
    assert str(segment) in str(info.value)
    # and a query about another table is not affected
    assert catalog.run_readonly_query(live.data_dir, "SELECT count(*) AS n FROM timers")["n"][0].as_py() == 0


def test_a_healthy_data_dir_quarantines_nothing(live, caplog):
    caplog.set_level(logging.WARNING, logger="collector.server.compaction")
    _stream_segments(live, "fine")
    live.state.compactor.run_once()
    assert not (live.data_dir / layout.QUARANTINE_DIR).exists()
    assert not [r for r in caplog.records if "quarantined" in r.getMessage()]
    assert _count(live.data_dir, "fine") == SEGMENTS * ROWS


def test_the_dashboards_catalog_skips_a_damaged_segment_with_a_warning_naming_it(live):
    from collector.data import queries

    for run_id in ("hurt", "fine"):
        _stream_segments(live, run_id)
    damaged = sorted(layout.partition_dir(live.data_dir, "comm", "hurt").glob("*.parquet"))[0]
    _truncate(damaged)
    cat = queries.Catalog(live.data_dir)
    try:
        with pytest.warns(catalog.UnreadableSegmentWarning, match=str(damaged)):
            fine = cat.df("SELECT count(*) AS n FROM comm WHERE run_id = ?", ["fine"])
        assert fine["n"][0] == SEGMENTS * ROWS
        # the damaged run shows what is left of it; views built on comm read the same
        assert cat.df("SELECT count(*) AS n FROM comm WHERE run_id = ?", ["hurt"])["n"][0] == (SEGMENTS - 1) * ROWS
        assert cat.df("SELECT count(DISTINCT run_id) AS n FROM comm_instances", [])["n"][0] == 2
    finally:
        cat.close()
