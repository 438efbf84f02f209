"""A run by id or name, as every command and the dashboard's ?run= take it (queries.runs.pick_run)."""

import pytest

from collector.data.queries.runs import AmbiguousRun, UnknownRun, pick_run

ROWS = [  # newest first, as resolve_run reads them
    ("demo-3", "demo", "stopped", "2026-11-28 01:30:00"),
    ("demo-2", "demo", "finished", "2026-11-28 01:20:00"),
    ("bert-1", "bert", "finished", "2026-11-28 01:10:00"),
    ("demo-1", "demo", "failed", "2026-11-28 01:00:00"),
]


def test_an_id_or_a_name_one_run_has():
    assert pick_run("demo-2", ROWS) == "demo-2"
    assert pick_run("bert", ROWS) == "bert-1"


def test_a_shared_name_is_refused_with_every_match_listed():
    with pytest.raises(AmbiguousRun) as refused:
        pick_run("demo", ROWS)
    assert refused.value.matches == ["demo-3", "demo-2", "demo-1"]
    message = str(refused.value)
    assert "3 runs are named 'demo'" in message and "Name one by its run id" in message
    assert "demo-3 (stopped, started 2026-11-28 01:30:00)" in message and "demo-1 (failed" in message


def test_a_shared_name_takes_the_one_run_still_running():
    live = [("demo-4", "demo", "running", "2026-11-28 01:40:00"), *ROWS]
    assert pick_run("demo", live) == "demo-4"
    two_live = [("demo-5", "demo", "running", "2026-11-28 01:50:00"), *live]
    with pytest.raises(AmbiguousRun):
        pick_run("demo", two_live)


def test_an_unknown_run_says_so():
    with pytest.raises(UnknownRun, match="no run with id or name 'gpt'"):
        pick_run("gpt", ROWS)
