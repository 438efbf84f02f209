"""The sampled Python stacks of a capture (collector.rank.stack_sampler), spliced into a real
torch.profiler trace (collector.rank.capture.with_python_spans) and read by trace_diff: a
function that loops in Python on one "rank" is named, its spans within the capture; the same
code without it is told apart from it; the spans are bounded by MAX_EVENTS."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from collector.data import trace_diff
from collector.rank import stack_sampler
from collector.rank.capture import with_python_spans
from collector.rank.stack_sampler import StackSampler

STEPS, SLOW_S = 3, 0.1  # a spin of several scheduler slices: a sampler starved on a loaded host still sees it


def spin_in_python(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # millions of calls: what torch's own tracer records each of
        pass


SPUN: list[float] = []  # how long each spin really took (s)
WINDOW_S: list[float] = []  # how long the suspect's capture ran (s)


def step(slow: bool) -> None:
    if slow:
        t0 = time.perf_counter()
        spin_in_python(SLOW_S)
        SPUN.append(time.perf_counter() - t0)
    torch.randn(64, 128) @ torch.randn(128, 128)


def captured(slow: bool, tmp_path: Path) -> dict:
    profiler = profile(activities=[ProfilerActivity.CPU])
    profiler.start()
    sampler = StackSampler(threading.get_ident())
    t0 = time.perf_counter()
    sampler.start()
    for _ in range(STEPS):
        step(slow)
    profiler.stop()
    sampler.stop()
    if slow:
        WINDOW_S[:] = [time.perf_counter() - t0]
    path = tmp_path / f"trace-{slow}.json"
    profiler.export_chrome_trace(str(path))
    return json.loads(with_python_spans(path.read_bytes(), sampler, threading.get_native_id()))


def test_a_function_spinning_in_python_is_named(tmp_path):
    SPUN.clear()
    suspect = captured(True, tmp_path)
    reference = captured(False, tmp_path)
    spans = [e for e in suspect["traceEvents"] if e.get("cat") == "python_function"]
    assert spans and all(e["pid"] == os.getpid() and e["tid"] == threading.get_native_id() for e in spans)
    assert any(e.get("cat") == "cpu_op" for e in suspect["traceEvents"])  # torch's own events kept
    # on the profiler's clock (the trace's baseTimeNanoseconds): within a second of its operators
    ops = [e["ts"] for e in suspect["traceEvents"] if e.get("cat") == "cpu_op"]
    assert min(ops) - 1e6 < min(e["ts"] for e in spans) < max(ops) + 1e6
    found = trace_diff.diff(
        suspect, reference, suspect_rank=1, reference_rank=0, suspect_steps=STEPS, reference_steps=STEPS
    )
    assert "spin_in_python" in found["headline"].split(";")[0], found["headline"]
    mine, _ = trace_diff.per_step(suspect, STEPS)
    theirs, _ = trace_diff.per_step(reference, STEPS)
    [spin] = [name for name in mine["python"] if name.endswith(": spin_in_python")]
    # every span lies within the capture: no more than a captured step's time per step (how close
    # it comes to the spin's own time depends on how often the sampler got the CPU: not asserted)
    assert 0 < mine["python"][spin] <= WINDOW_S[0] * 1e3 / STEPS, (mine["python"][spin], WINDOW_S, SPUN)
    assert spin not in theirs["python"]


def test_without_the_slow_function_no_python_difference_stands_out(tmp_path):
    one = captured(False, tmp_path)
    other = captured(False, tmp_path)
    found = trace_diff.diff(one, other, suspect_rank=1, reference_rank=0, suspect_steps=STEPS, reference_steps=STEPS)
    assert "spin_in_python" not in json.dumps(found)


def test_no_span_holds_the_samplers_own_start():
    """Thread.start waits for the sampler's thread to run, and the sampled thread then waits for the
    CPU to come back (100 ms and more on a loaded host: a fresh clone's evidence test named that wait,
    "wait -> wait", as the suspect's slowest code). Spans begin once start() has returned. Here the
    sampled thread comes back 50 ms late from that wait (a profile hook sleeps on its return)."""
    late = []

    def comes_back_late(frame, event, _arg):
        if event == "return" and frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__:
            if not late:
                late.append(frame.f_code.co_name)
                time.sleep(0.05)

    sampler = StackSampler(threading.get_ident(), interval_s=0.001)
    sys.setprofile(comes_back_late)
    try:
        sampler.start()
    finally:
        sys.setprofile(None)
    spin_in_python(SLOW_S)
    sampler.stop()
    assert late, "the sampled thread never waited in Thread.start"
    names = [name for *_, name in sampler.spans]
    assert any(name.endswith(": spin_in_python") for name in names), names
    starting = [n for n in names if n.startswith(threading.__file__) and n.endswith((": start", ": wait"))]
    assert not starting, starting


def test_spans_stop_at_the_bound(monkeypatch):
    monkeypatch.setattr(stack_sampler, "MAX_EVENTS", 5)
    sampler = StackSampler(threading.get_ident(), interval_s=0.001)
    sampler.start()
    deadline = time.monotonic() + 60
    while sampler._thread.is_alive() and time.monotonic() < deadline:
        for depth in range(3):  # a changing stack: a new span at nearly every sample
            nested(depth)
    alive = sampler._thread.is_alive()
    sampler.stop()
    assert not alive, "the sampler never reached its bound"
    assert 5 <= len(sampler.spans) <= 5 + stack_sampler.MAX_DEPTH
    assert all(end >= start for _, _, start, end, _ in sampler.spans)


def nested(depth: int) -> None:
    if depth:
        nested(depth - 1)
    else:
        spin_in_python(0.002)


def test_a_trace_without_an_event_list_is_refused():
    sampler = StackSampler(threading.get_ident())
    try:
        with_python_spans(b'{"schemaVersion": 1}', sampler, 1)
    except ValueError as exc:
        assert "traceEvents" in str(exc)
    else:
        raise AssertionError("a trace without traceEvents was accepted")
