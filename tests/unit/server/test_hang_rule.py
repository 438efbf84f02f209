"""The hang rule (collector.data.hang_rule) and its users agree: the threshold of a collective is the
smallest hang_after_s among the ranks waiting in it, in Python (the watchdog, the collector's live
view) and in SQL (the catalog's hangs view); a collective waited in for less is not hung."""

from __future__ import annotations

import math
import time

import duckdb
import pytest

from collector.data import hang_rule
from collector.data.codec import encode_batch
from collector.server.liveness import Liveness
from collector.testing import fake_runs
from proto import pb

# (rank, waited s, its hang_after_s) per collective; the expected verdict
CASES = [
    ([(0, 3.0, 5.0), (1, 4.9, 5.0)], False),
    ([(0, 5.0, 5.0), (1, 1.0, 5.0)], True),
    ([(0, 10.0, 60.0), (1, 3.0, 2.0)], True),  # rank 1 asked to hear after 2 s: it does
    ([(0, 10.0, 60.0), (1, 3.0, None)], False),  # a rank without a setting has no say
    ([(0, 100.0, None)], False),  # nobody's setting: never judged
]


@pytest.mark.parametrize("rows, hung", CASES)
def test_the_rule_in_python_and_in_sql_gives_the_same_verdict(rows, hung):
    threshold = hang_rule.threshold(s for _, _, s in rows)
    assert hang_rule.is_hung(max(w for _, w, _ in rows), threshold) is hung
    con = duckdb.connect()
    con.execute("CREATE TABLE open_ (rank BIGINT, waiting_s DOUBLE, hang_after_s DOUBLE)")
    con.executemany("INSERT INTO open_ VALUES (?, ?, ?)", rows)
    [(sql_hung,)] = con.execute(f"SELECT coalesce({hang_rule.HUNG_SQL}, false) FROM open_").fetchall()
    assert sql_hung is hung


def test_a_run_without_settings_has_no_threshold():
    assert hang_rule.threshold([]) == math.inf
    assert hang_rule.threshold([None, 30.0, 5.0]) == 5.0


class RecordingStream:
    def __init__(self) -> None:
        self.requests: list[pb.RankRequest] = []

    def request(self, request: pb.RankRequest) -> None:
        self.requests.append(request)


class NoStore:
    def submit(self, *args) -> None:
        pass


def _waiting(
    run_id: str, rank: int, waited_s: float, hang_after_s: float, now_ns: int, numel: int = 4, state: str = "waiting"
) -> pb.Envelope:
    cols = {
        "step": [3], "group_name": ["world"], "group_size": [3], "group_ranks": ["0-2"], "seq": [7],
        "op": ["all_reduce"], "dtype": ["float32"], "numel": [numel], "bytes": [4 * numel],
        "entered_ns": [now_ns - int(waited_s * 1e9)], "time_ns": [now_ns], "hang_after_s": [hang_after_s],
        "state": [state],
    }  # fmt: skip
    return fake_runs.envelope(f"c{rank}", 2, table=encode_batch("inflight", run_id, rank, cols))


@pytest.mark.parametrize("settings, hung", [((60.0, 2.0), True), ((60.0, 60.0), False)])
def test_the_collector_asks_the_missing_rank_once_the_smallest_setting_has_passed(settings, hung):
    """Ranks 0 and 1 wait in all_reduce #7 of world (ranks 0-2) for 4 and 3 s; rank 2 never came.
    With rank 1's hang_after_s at 2 s the collective is hung and rank 2 is asked for its stacks; with
    every setting at 60 s nobody is asked yet (the adaptive rule asks half way to stuck, and a kind
    of collective without a normal is stuck at hang_rule.UNLEARNED_STUCK_S)."""
    liveness = Liveness(NoStore(), start=False)
    streams = {r: RecordingStream() for r in range(3)}
    now_ns = time.time_ns()
    for r in range(3):
        liveness.observe(streams[r], fake_runs.hello(f"c{r}", 1, "run", r, 3))
    for r, (waited, setting) in enumerate(zip((4.0, 3.0), settings, strict=True)):
        liveness.observe(streams[r], _waiting("run", r, waited, setting, now_ns))
    liveness.check(now_ns)
    asked = {r: [q.reason for q in s.requests] for r, s in streams.items() if s.requests}
    assert asked == ({2: ["missing from all_reduce #7 of world"]} if hung else {})


class FlushCountingStore(NoStore):
    def __init__(self) -> None:
        self.flushes = 0

    def flush_soon(self) -> None:
        self.flushes += 1


def test_the_report_that_crosses_a_ranks_setting_is_committed_at_once_and_only_that_one():
    """A rank's in-flight report past its hang_after_s has the store commit now (someone polling
    health waits for it); reports below it, and the same collective reported again, wait for the
    store's interval as everything else does."""
    store = FlushCountingStore()
    liveness = Liveness(store, start=False)
    stream = RecordingStream()
    now_ns = time.time_ns()
    liveness.observe(stream, _waiting("run", 0, 1.0, 5.0, now_ns))
    assert store.flushes == 0
    liveness.observe(stream, _waiting("run", 0, 5.0, 5.0, now_ns + int(4e9)))
    assert store.flushes == 1
    liveness.observe(stream, _waiting("run", 0, 6.0, 5.0, now_ns + int(5e9)))
    assert store.flushes == 1
