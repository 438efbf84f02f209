"""findings.stuck: the stacks of the ranks not arrived decide the words and the severity, both ways
(a checkpoint is info, not a warning; a data loader, another collective, a dead rank each named)."""

from __future__ import annotations

from collector.data import hang_rule
from collector.data.findings.stuck import Missing, Stuck, activity, stuck_collectives


def _stack(*frames: tuple[str, int, str]) -> str:
    return "".join(f'  File "{path}", line {line}, in {func}\n    pass\n' for path, line, func in frames)


TRAIN = ("/job/train.py", 120, "main")
SAVE = _stack(TRAIN, ("/venv/torch/serialization.py", 650, "save"), ("/venv/torch/serialization.py", 880, "_save"))
LOADER = _stack(TRAIN, ("/venv/torch/utils/data/dataloader.py", 700, "__next__"), ("/job/data.py", 12, "read"))
SLEEP = _stack(TRAIN, ("/job/train.py", 88, "stall_before_collective"))


def _stuck(*missing: Missing, waited_s: float = 4.0, waiting=(1, 2, 3)) -> Stuck:
    return Stuck(
        group_name="world",
        seq=25,
        op="barrier",
        step=10,
        waiting=tuple(waiting),
        missing=missing,
        waited_s=waited_s,
        normal_s=0.03,
        stuck_after_s=hang_rule.stuck_after(0.03, 60.0),
        hang_after_s=60.0,
    )


def test_activity_reads_the_stack():
    assert activity(SAVE) == "checkpoint"
    assert activity(_stack(TRAIN, ("/job/train.py", 40, "save_checkpoint"))) == "checkpoint"
    assert activity(LOADER) == "data"
    assert activity(SLEEP) == "other"
    assert activity(_stack(TRAIN, ("/venv/torch/distributed/distributed_c10d.py", 2500, "all_reduce"))) == "collective"
    assert activity("") == "unknown"


def test_a_checkpoint_save_is_info_naming_who_saves_and_who_waits():
    [f] = stuck_collectives([_stuck(Missing(rank=0, stack=SAVE))])
    assert (f.kind, f.severity) == ("stuck", "info")
    assert f.text.startswith("rank 0 is saving a checkpoint (at serialization.py:880 in _save); ranks 1-3 wait")
    assert f.evidence["causes"] == {"checkpoint": [0]} and "serialization.py" in f.evidence["stacks"]["0"]


def test_a_rank_elsewhere_is_a_warning_naming_where_it_is():
    [f] = stuck_collectives([_stuck(Missing(rank=0, stack=SLEEP))])
    assert (f.kind, f.severity) == ("stuck", "warning")
    assert "stuck: ranks 1-3 waiting 4 s in barrier #25 of world at step 10 (normally 30 ms)" in f.text
    assert "rank 0 is at train.py:88 in stall_before_collective" in f.text
    assert f.ranks == (0,)


def test_data_loader_desync_crash_and_no_stack_yet_are_each_named():
    [f] = stuck_collectives(
        [
            _stuck(
                Missing(rank=0, stack=LOADER),
                Missing(rank=4, elsewhere=("tp-1", 7, "all_gather")),
                Missing(rank=5, gone=True),
                Missing(rank=6),
                waiting=(1, 2, 3),
            )
        ]
    )
    assert f.severity == "warning"
    assert "rank 0 is waiting for data (at data.py:12 in read)" in f.text
    assert "rank 4 is waiting in all_gather #7 of tp-1 instead" in f.text and "desync" in f.text
    assert "rank 5 is gone" in f.text and "crashed" in f.text
    assert "rank 6 is not there yet" in f.text
    assert f.evidence["causes"] == {"data": [0], "desync": [4], "gone": [5], "unknown": [6]}


def test_a_checkpoint_beside_another_cause_is_not_only_info():
    [f] = stuck_collectives([_stuck(Missing(rank=0, stack=SAVE), Missing(rank=4, gone=True))])
    assert f.severity == "warning"


def test_past_hang_after_s_it_is_the_critical_hang_whatever_the_stacks():
    [f] = stuck_collectives([_stuck(Missing(rank=0, stack=SAVE), waited_s=61.0)])
    assert (f.kind, f.severity) == ("hang", "critical")
    assert f.text.startswith("hang: ranks 1-3 stuck 61 s in barrier #25 of world") and "saving a checkpoint" in f.text


def test_the_adaptive_threshold():
    assert hang_rule.stuck_after(0.03) == hang_rule.STUCK_FLOOR_S  # a fast collective: the floor
    assert hang_rule.stuck_after(2.0) == hang_rule.STUCK_FACTOR * 2.0  # a slow kind: its own normal
    assert hang_rule.stuck_after(None) == hang_rule.UNLEARNED_STUCK_S
    assert hang_rule.stuck_after(None, 2.0) == 2.0  # never after the rank's own hang_after_s
    assert hang_rule.size_class(0) == 0 and hang_rule.size_class(16) == hang_rule.size_class(60)
    assert hang_rule.size_class(16) != hang_rule.size_class(1 << 20)
