"""Python stacks of the training thread during a capture, sampled rather than traced.

torch.profiler's ``with_stack`` installs a tracer that records every Python call, C calls
included: its cost follows the number of calls, not the time. On a step that busy-waits in Python
(a slow rank's own code, a spin on a flag) it recorded 73 MiB of trace for 3 steps of 20 ms, took
0.7 s to stop on the training thread and 0.3 s to export (benches/RESULTS-evidence.md); a rank
80 ms late ran 645 ms a step while so profiled. A sampler's cost follows time instead: every
``interval_s`` a thread of its own reads the training thread's frames (``sys._current_frames``,
under the GIL, ~10 µs) and extends or closes the spans of the functions on it, so a capture holds
at most MAX_EVENTS spans whatever the code does.

``chrome_events`` writes the spans as torch.profiler writes its Python events (``cat``
``python_function``, ``file(first line): function``, ``Python id`` / ``Python parent id``), on the
training thread's ``tid``, so collector.data.trace_diff reads both alike. Each sample stands for
the time since the one before, the first for the time since ``start`` returned (on a busy host, or
while the training thread holds the GIL, the sampler runs less often than asked): a call's span
runs from the sample before the first that saw it to the last that saw it, so a step's time is
shared out whole. A call shorter than the interval may be missed or credited to its neighbour,
which a comparison of where milliseconds per step went can afford; a sampler starved of CPU for
long (a host loaded many times over) credits each long gap to the stack it then finds.
Consecutive calls whose frames reuse an address merge into one span.
"""

from __future__ import annotations

import sys
import threading

from collector.rank.clock import CLOCK

INTERVAL_S = 0.002
MAX_DEPTH = 128  # innermost frames kept
MAX_EVENTS = 100_000  # spans per capture; sampling stops beyond


class StackSampler:
    def __init__(self, thread_id: int, interval_s: float = INTERVAL_S) -> None:
        self.thread_id, self.interval_s = thread_id, interval_s
        self.spans: list[tuple[int, int, int, int, str]] = []  # (id, parent id, start ns, end ns, name)
        self._open: list[tuple[int, object, int, str, int]] = []  # (frame id, code, span id, name, start ns)
        self._next_id = 1
        self._last_ns = 0  # the previous sample's time (or the start's)
        self.samples = 0
        self._stop = threading.Event()
        self._begun = threading.Event()  # start() has returned on the sampled thread
        self._thread = threading.Thread(target=self._run, name="rankscope-stack-sampler", daemon=True)

    def start(self) -> None:
        """Sample from when this returns. Thread.start waits for the new thread to run, on a loaded
        host for 100 ms and more: that wait is the sampler's, not the training's, so no span holds it
        (a capture once named its own start, "wait -> wait", as the suspect's slowest code)."""
        self._thread.start()
        self._last_ns = CLOCK.now_ns()
        self._begun.set()

    def request_stop(self) -> None:
        """Stop sampling from the next wake (on the training thread: no wait; ``finish`` on another)."""
        self._stop.set()

    def finish(self) -> None:
        """Wait for the sampler to end and close the spans still open (at the last sample)."""
        self._stop.set()
        self._thread.join()
        self._close_from(0, self._last_ns)

    def stop(self) -> None:
        self.request_stop()
        self.finish()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._begun.is_set():
                continue
            frame = sys._current_frames().get(self.thread_id)
            if frame is None or self._stop.is_set():  # the thread ended, or the capture did meanwhile
                return
            self._sample(frame, CLOCK.now_ns())
            del frame
            if len(self.spans) >= MAX_EVENTS:  # bounded: stop here; ``stop`` closes what is open
                return

    def _sample(self, frame, now: int) -> None:
        stack = []
        while frame is not None and len(stack) < MAX_DEPTH:
            stack.append((id(frame), frame.f_code))
            frame = frame.f_back
        stack.reverse()  # outermost first
        same = 0
        for (fid, code), (open_fid, open_code, *_) in zip(stack, self._open, strict=False):
            if fid != open_fid or code is not open_code:
                break
            same += 1
        before = self._last_ns  # this sample stands for the time since the one before
        self._close_from(same, before)
        for fid, code in stack[same:]:
            name = f"{code.co_filename}({code.co_firstlineno}): {code.co_name}"
            self._open.append((fid, code, self._next_id, name, before))
            self._next_id += 1
        self._last_ns = now
        self.samples += 1

    def _close_from(self, depth: int, now: int) -> None:
        while len(self._open) > depth:
            _, _, span_id, name, start = self._open.pop()
            parent = self._open[-1][2] if self._open else 0
            self.spans.append((span_id, parent, start, now, name))

    def chrome_events(self, pid: int, tid: int, base_ns: int) -> list[dict]:
        """The spans as Chrome trace events; ``base_ns`` is the trace's ``baseTimeNanoseconds``."""
        return [
            {
                "ph": "X",
                "cat": "python_function",
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": (start - base_ns) / 1000,
                "dur": (end - start) / 1000,
                "args": {"Python id": span_id, "Python parent id": parent, "sampled": True},
            }
            for span_id, parent, start, end, name in self.spans
        ]
