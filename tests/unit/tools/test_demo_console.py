"""The demo's console filter (collector.tools.demo.OnceFilter): what a newcomer reads while it trains."""

import io

from collector.tools.demo import OnceFilter


def _console(lines, fault=None) -> list[str]:
    out = io.StringIO()
    once = OnceFilter(out)
    once.fault = fault
    for line in lines:
        once.write_line(line + "\n")
    return out.getvalue().splitlines()


def test_the_staged_fault_is_told_when_the_training_reaches_its_step():
    lines = [f"[gpt] step {s} loss 1.0" for s in range(1, 8)]
    shown = _console(lines, fault=(5, "the staged fault is on"))
    assert shown == ["[gpt] step 1 loss 1.0", "[demo] step 5: the staged fault is on"]


def test_a_user_error_is_shown_once_and_what_follows_is_dropped():
    once_out = io.StringIO()
    once = OnceFilter(once_out)
    for line in ["error: zero_optimization.stage: must be one of 0, 1, 2, 3 (got 4)"] * 2 + ["Traceback (most recent"]:
        once.write_line(line + "\n")
    assert once_out.getvalue().splitlines() == ["error: zero_optimization.stage: must be one of 0, 1, 2, 3 (got 4)"]
    assert once.error.startswith("error: zero_optimization.stage")


def test_profiler_trace_points_and_repeats_are_dropped():
    shown = _console(["USDT:2026-11-28 01:58:04 27443 profiler_start", "hello", "hello"])
    assert shown == ["hello"]
