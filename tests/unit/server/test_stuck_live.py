"""The collector's live view learns each collective's normal wait from the comm rows the ranks send
and names a collective stuck far beyond it, seconds in, at default settings (hang_after_s 60 s),
with where the missing rank is (its stack); and not before (a wait within the floor, a kind of
collective without a normal yet)."""

from __future__ import annotations

import time

from collector.data import hang_rule
from collector.data.codec import encode_batch, envelope_rows
from collector.server.liveness import Liveness
from collector.testing import fake_runs
from tests.unit.server.test_hang_rule import NoStore, RecordingStream, _waiting

RUN, WORLD = "run", 3


def _comm(rank: int, seq0: int, wait_s: float, n: int = 8) -> tuple:
    now = time.time_ns()
    cols = {
        "step": list(range(n)), "group_name": ["world"] * n, "group_size": [WORLD] * n,
        "seq": list(range(seq0, seq0 + n)), "op": ["all_reduce"] * n, "log_name": ["all_reduce"] * n,
        "dtype": ["float32"] * n, "numel": [4] * n, "bytes": [16] * n,
        "start_ns": [now - int(wait_s * 1e9)] * n, "end_ns": [now] * n, "async_op": [False] * n,
        "algbw_gbs": [0.0] * n, "busbw_gbs": [0.0] * n,
    }  # fmt: skip
    env = fake_runs.envelope(f"c{rank}", seq0, table=encode_batch("comm", RUN, rank, cols))
    return env, envelope_rows(env)


def _stacks(rank: int, stack: str, time_ns: int):
    cols = {
        "step": [5], "reason": ["missing"], "thread_name": ["MainThread"], "thread_id": [1], "is_main": [True],
        "stack": [stack], "innermost": ["train.py:88 in stall"], "time_ns": [time_ns],
    }  # fmt: skip
    return fake_runs.envelope(f"c{rank}", 99, table=encode_batch("stacks", RUN, rank, cols))


def _live(learned_wait_s: float | None, answer_within_s: float = 0.0) -> tuple[Liveness, dict]:
    """A live view of 3 ranks; ``answer_within_s`` 0: a missing rank's stack is not waited for."""
    liveness = Liveness(NoStore(), start=False, answer_within_s=answer_within_s)
    streams = {r: RecordingStream() for r in range(WORLD)}
    for r in range(WORLD):
        liveness.observe(streams[r], fake_runs.hello(f"c{r}", 1, RUN, r, WORLD))
    if learned_wait_s is not None:
        for batch in range(hang_rule.MIN_SAMPLES):
            env, rows = _comm(0, 1 + 8 * batch, learned_wait_s)
            liveness.observe(streams[0], env, rows)
            liveness.normals[RUN].learn_at = 0.0  # each batch teaches (the rate limit is for 1,024 ranks)
    return liveness, streams


def test_a_runs_warm_up_batches_arriving_together_all_teach():
    """Ranks flush their warm-up comm rows within a few ms of each other: the rate limit (for 1,024
    ranks) would let one of them teach, and a short warm-up would leave the kind without a normal
    (stuck at hang_rule.UNLEARNED_STUCK_S instead of seconds; seen under load in test_stuck)."""
    liveness, streams = _live(learned_wait_s=None)
    for batch in range(hang_rule.MIN_SAMPLES):
        env, rows = _comm(batch, 1 + 8 * batch, 0.02)
        liveness.observe(streams[batch], env, rows)
    assert liveness.normals[RUN].normal("world", "all_reduce", 16) == 0.02


def _waits(liveness, streams, waited_s: float, now_ns: int) -> None:
    for r in (0, 1):
        liveness.observe(streams[r], _waiting(RUN, r, waited_s, hang_rule.DEFAULT_HANG_AFTER_S, now_ns))


def test_a_collective_far_beyond_its_normal_is_stuck_in_seconds_naming_the_missing_ranks_stack():
    liveness, streams = _live(learned_wait_s=0.02, answer_within_s=5.0)
    assert liveness.normals[RUN].normal("world", "all_reduce", 16) == 0.02
    changes = []
    liveness.on_change = changes.append
    now_ns = time.time_ns()
    _waits(liveness, streams, hang_rule.STUCK_FLOOR_S / 2 + 0.1, now_ns)  # half way: rank 2 is asked already
    liveness.check(now_ns)
    assert [q.reason for q in streams[2].requests] == ["missing from all_reduce #7 of world"], "rank 2 not asked"
    assert liveness.findings(RUN) == []
    _waits(liveness, streams, hang_rule.STUCK_FLOOR_S + 0.5, now_ns)
    liveness.check(now_ns)
    assert liveness.findings(RUN) == [], "named before its stack could say where rank 2 is"
    # its stack arrives: the words follow it
    stack = '  File "/job/train.py", line 88, in stall_before_collective\n    time.sleep(9)\n'
    liveness.observe(streams[2], _stacks(2, stack, now_ns))
    liveness.check(now_ns)
    [f] = liveness.findings(RUN)
    assert (f.kind, f.severity, f.ranks) == ("stuck", "warning", (2,)), f
    assert "ranks 0-1 waiting 4 s in all_reduce #7 of world" in f.text, f.text
    assert "rank 2 is at train.py:88 in stall_before_collective" in f.text, f.text
    assert changes == [RUN], "the change was not announced"
    assert len(streams[2].requests) == 1, "asked twice"


def test_a_missing_rank_that_does_not_answer_is_named_without_its_stack():
    liveness, streams = _live(learned_wait_s=0.02)
    now_ns = time.time_ns()
    _waits(liveness, streams, hang_rule.STUCK_FLOOR_S + 0.5, now_ns)
    liveness.check(now_ns)
    [f] = liveness.findings(RUN)
    assert "rank 2 is not there yet (stacks asked for)" in f.text, f.text


def test_no_stuck_within_the_floor_or_for_a_kind_without_a_normal_yet():
    liveness, streams = _live(learned_wait_s=0.02)
    now_ns = time.time_ns()
    _waits(liveness, streams, hang_rule.STUCK_FLOOR_S - 0.5, now_ns)  # a 1 s data-loader hiccup, twice over
    liveness.check(now_ns)
    assert liveness.findings(RUN) == []  # (rank 2 was asked for its stack: half way to stuck)
    liveness, streams = _live(learned_wait_s=None)  # a first checkpoint barrier: nothing learned
    _waits(liveness, streams, hang_rule.UNLEARNED_STUCK_S - 1.0, now_ns)
    liveness.check(now_ns)
    assert liveness.findings(RUN) == []
    _waits(liveness, streams, hang_rule.UNLEARNED_STUCK_S + 0.5, now_ns)
    liveness.check(now_ns)
    assert [f.kind for f in liveness.findings(RUN)] == ["stuck"]


def test_a_slow_kind_of_collective_is_judged_against_its_own_normal():
    liveness, streams = _live(learned_wait_s=2.0)  # e.g. a rank-0 eval that others always wait for
    now_ns = time.time_ns()
    _waits(liveness, streams, 2.0 * hang_rule.STUCK_FACTOR - 1.0, now_ns)
    liveness.check(now_ns)
    assert liveness.findings(RUN) == []
    _waits(liveness, streams, 2.0 * hang_rule.STUCK_FACTOR + 0.5, now_ns)
    liveness.check(now_ns)
    assert [f.kind for f in liveness.findings(RUN)] == ["stuck"]


def test_the_finding_leaves_with_the_collective():
    liveness, streams = _live(learned_wait_s=0.02)
    changes = []
    liveness.on_change = changes.append
    now_ns = time.time_ns()
    _waits(liveness, streams, 5.0, now_ns)
    liveness.check(now_ns)
    assert liveness.findings(RUN)
    for r in (0, 1):  # the collective completed: the next beats no longer report it
        liveness.runs[RUN][r].inflight.clear()
    liveness.check(now_ns)
    assert liveness.findings(RUN) == [] and changes == [RUN, RUN]


def test_a_stuck_wait_is_not_learned_as_normal_and_one_long_wait_among_many_does_not_move_it():
    liveness, streams = _live(learned_wait_s=0.02)
    env, rows = _comm(0, 100, 8.0)  # the hang that resolved: rank 0 waited 8 s
    liveness.normals[RUN].learn_at = 0.0
    liveness.observe(streams[0], env, rows)
    assert liveness.normals[RUN].normal("world", "all_reduce", 16) == 0.02
    for batch in range(20):  # a 2 s data-loader stall once among 20 batches of 20 ms waits
        env, rows = _comm(1, 200 + 8 * batch, 2.0 if batch == 7 else 0.02)
        liveness.normals[RUN].learn_at = 0.0
        liveness.observe(streams[1], env, rows)
    assert liveness.normals[RUN].normal("world", "all_reduce", 16) == 0.02


def test_the_held_findings_merge_the_live_judgment_and_tell_listeners_at_once():
    """collector.server.live_findings: what Health, /metrics and the webhook read."""
    from collector.data.findings.model import Finding
    from collector.server.live_findings import LiveFindings

    liveness, streams = _live(learned_wait_s=0.02)
    held = LiveFindings(liveness)
    heard = []
    held.listen(lambda run_id, name, found: heard.append((run_id, name, [f.kind for f in found])))
    assert held.answer(RUN)[1] is False, "held before the refresh computed the stored part"
    stored = [
        Finding(kind="hang", severity="critical", text="stored hang", evidence={"group_name": "world", "seq": 7}),
        Finding(kind="stuck", severity="warning", text="stale stuck", evidence={"group_name": "world", "seq": 3}),
        Finding(kind="straggler", severity="warning", text="rank 1 is late", ranks=(1,)),
    ]
    held.stored(RUN, "job", stored)
    run_id, is_held, found, _ = held.answer("job")  # by name
    assert (run_id, is_held, [f.kind for f in found]) == (RUN, True, ["hang", "straggler"])  # stuck: live only
    now_ns = time.time_ns()
    _waits(liveness, streams, 5.0, now_ns)
    liveness.check(now_ns)
    assert heard == [(RUN, "job", ["straggler", "stuck"])], heard  # the live one in place of the stored two
    assert held.current(RUN)[0].text == "rank 1 is late"
    for r in range(WORLD):  # every rank sent its RunEnd: the data dir has the last word
        liveness.observe(streams[r], fake_runs.run_end(f"c{r}", 50, RUN, r))
    assert held.answer(RUN)[1] is False


def _beat(rank: int, step: int, time_ns: int):
    cols = {"step": [step], "time_ns": [time_ns], "period_s": [1.0], "inflight": [0], "hang_after_s": [60.0],
            "ending": [False]}  # fmt: skip
    return fake_runs.envelope(f"c{rank}", 50 + step, table=encode_batch("heartbeats", RUN, rank, cols))


def test_a_rank_gone_is_told_live_at_once_as_the_stored_rows_will_tell_it():
    """A rank whose stream closes without RunEnd (a crash) is a live ``rank_stopped`` at once, worded
    as collector.data.findings.silent words it from the stored rows (the last beat's step), in place
    of a stored one; the answer stays held (before, Health left it to the data dir until the next
    refresh), alerts hear it, and the findings refresh is asked to catch up."""
    from collector.data.findings.model import Finding
    from collector.server.live_findings import LiveFindings

    liveness, streams = _live(learned_wait_s=0.02)
    held = LiveFindings(liveness)
    heard, refreshes = [], []
    held.listen(lambda run_id, name, found: heard.append([f.kind for f in found]))
    liveness.on_rank_gone = lambda: refreshes.append(1)
    now_ns = time.time_ns()
    for r in range(WORLD):
        liveness.observe(streams[r], _beat(r, 24 if r == 2 else 25, now_ns))
    straggler = [Finding(kind="straggler", severity="warning", text="rank 1 is late", ranks=(1,))]
    held.stored(RUN, "job", straggler, as_of=time.monotonic())
    liveness.closed(streams[2])  # rank 2's process died
    _, is_held, found, _ = held.answer(RUN)
    assert is_held, "a rank gone left the answer to the data dir"
    kinds = [(f.kind, f.severity, f.ranks) for f in found]
    assert kinds == [("rank_stopped", "critical", (2,)), ("straggler", "warning", (1,))], kinds
    assert found[0].text == "rank 2 stopped at step 24 without ending the run", found[0].text
    assert heard == [["rank_stopped", "straggler"]] and refreshes == [1]
    # the refresh that has the event: its stored rank_stopped gives way to the live one (one line, not two)
    held.stored(RUN, "job", [*straggler, Finding(kind="rank_stopped", severity="critical", text="stored", ranks=(2,))])
    assert [f.text for f in held.current(RUN)] == [found[0].text, "rank 1 is late"]
    liveness.closed(streams[0])  # the rest stop 100+ ms later: rank 2 first, as silent's rule tells a crash
    liveness.runs[RUN][0].gone_ns = liveness.runs[RUN][2].gone_ns + int(0.2e9)
    [stopped] = [f for f in held.answer(RUN)[2] if f.kind == "rank_stopped"]
    assert stopped.text.startswith("rank 2 stopped first, at step 24 (connection closed without ending the run, 200 ms")


def test_news_the_live_view_does_not_tell_leaves_the_answer_to_the_data_dir_until_a_refresh_has_it():
    """A rank that did not answer a stack request, or a collective that raised where the stored part
    has a hang it may end, is told by a stored row: findings refreshed from rows before it are stale,
    so Health says "not held" (the CLI computes from the data dir, which has the row once the store
    commits it) until a refresh made from rows that include it. A collective that raised changes
    nothing else the stored part says (a crash's peers raise at once: the answer stays held)."""
    from collector.data.findings.model import Finding
    from collector.server.live_findings import LiveFindings

    liveness, streams = _live(learned_wait_s=0.02)
    held = LiveFindings(liveness)
    straggler = [Finding(kind="straggler", severity="warning", text="rank 1 is late", ranks=(1,))]
    hang = Finding(kind="hang", severity="critical", text="stored hang", evidence={"group_name": "world", "seq": 7})
    before_news = time.monotonic()
    held.stored(RUN, "job", straggler, as_of=before_news)
    liveness.observe(streams[0], _waiting(RUN, 0, 0.5, 60.0, time.time_ns(), state="failed"))  # a peer gone
    assert liveness.news_at(RUN) > before_news
    assert held.answer(RUN)[1] is True, "a collective that raised hid a straggler nothing changed"
    held.stored(RUN, "job", [*straggler, hang], as_of=before_news)
    assert held.answer(RUN)[1] is False, "a stored hang the collective that raised may end was answered"
    held.stored(RUN, "job", straggler, as_of=time.monotonic())  # a refresh whose rows include it
    liveness._event(RUN, 1, "unresponsive", "no stacks within 5 s of asking")
    assert held.answer(RUN)[1] is False, "the stale refresh answered for a rank that stopped answering"
    held.stored(RUN, "job", straggler, as_of=time.monotonic())
    assert held.answer(RUN)[1] is True


def test_ranks_in_flight_in_one_collective_with_different_shapes_are_a_desync_at_once_not_a_hang():
    """ddp-desync's shape: every rank is in all_reduce #7 of world, rank 2 with 5 elements where the
    others have 4 (nobody is missing, so no wait would ever name a rank). The live view names the
    mismatch at its first check, with both sides, as the stored rule words it; no stuck or hang."""
    from collector.data.findings.model import Finding
    from collector.server.live_findings import LiveFindings

    liveness, streams = _live(learned_wait_s=0.02)
    held = LiveFindings(liveness)
    heard = []
    held.listen(lambda run_id, name, found: heard.append([f.kind for f in found]))
    stale = Finding(kind="desync", severity="critical", text="stored", evidence={"group_name": "world", "seq": 7})
    held.stored(RUN, "job", [stale])
    now_ns = time.time_ns()
    for r in range(WORLD):  # rank 2 with one element more
        liveness.observe(
            streams[r], _waiting(RUN, r, 120.0, hang_rule.DEFAULT_HANG_AFTER_S, now_ns, 5 if r == 2 else 4)
        )
    liveness.check(now_ns)
    found = liveness.findings(RUN)
    assert [(f.kind, f.severity, f.ranks) for f in found] == [("desync", "critical", (2,))], found
    assert "numel differ" in found[0].text and "x5 on rank 2" in found[0].text, found[0].text
    assert [f.text for f in held.current(RUN)] == [found[0].text], "the stored one of the same collective stays"
    assert heard == [["desync"]]
    assert not any(s.requests for s in streams.values()), "nobody is missing: nobody is asked for stacks"


def test_a_new_run_says_so_once_so_its_findings_are_held_from_its_start():
    """The findings refresh is woken by a run's first Hello (collector.server.metrics.refresh_soon),
    not by every rank's, nor by a rank that reconnects."""
    liveness = Liveness(NoStore(), start=False)
    heard = []
    liveness.on_new_run = lambda: heard.append(1)
    streams = {r: RecordingStream() for r in range(WORLD)}
    for r in range(WORLD):
        liveness.observe(streams[r], fake_runs.hello(f"c{r}", 1, RUN, r, WORLD))
    liveness.observe(streams[0], fake_runs.hello("c0", 7, RUN, 0, WORLD))  # rank 0 reconnects
    assert heard == [1]
    liveness.observe(RecordingStream(), fake_runs.hello("d0", 1, "another-run", 0, 1))
    assert heard == [1, 1]
