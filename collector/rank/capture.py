"""What a rank does when the collector asks for evidence: profile its next steps, report memory.

The collector's requests ride its acks (``pb.RankRequest``, collector.server.commands); the
client's ack reader hands each here (through the watchdog's dispatcher), and this module answers
with rows of the ``artifacts`` table and, for a capture, one ``pb.Artifact`` envelope:

* ``accepted`` at once, or ``refused`` with the reason (a profiler is already active, steps
  outside 1..MAX_STEPS, an unknown kind);
* for ``profile``: torch.profiler (CPU activity; ``record_shapes`` as asked) starts at the next
  step boundary and stops at the boundary ``steps`` steps later, both on the training thread
  (``state.on_step``: no thread is interrupted, no device is synchronised). ``with_stack`` asks for
  the training thread's Python stacks, *sampled* (collector.rank.stack_sampler), not traced by
  torch's own tracer, whose cost follows the number of Python calls and is unbounded on code that
  loops in Python. Exporting (torch's C++ writer), adding the sampled spans, compressing and
  bounding the trace happen on a thread of its own, which hands the gzip'd Chrome/Perfetto JSON
  to the client (``Client.send_artifact``). The collector stores it
  and writes the ``captured`` row. A trace over ``MAX_TRACE_BYTES`` compressed, a profiler that
  fails, or a run that ends mid-capture is a ``failed`` row saying why;
* for ``memory``: this process's RSS and, where CUDA is in use, the caching allocator's
  counters, as a small JSON artifact (host-side reads only).

One capture at a time per process: a second request while one waits, runs or is still being
exported is refused (torch starts no new profiler while the last one's trace is written).

No capture may take the process down, so torch is touched on two threads only, never at once
for one profiler: the training thread starts and stops it (torch 2.13's profiler can crash a
process when it is stopped on a thread other than the one that started it), and the capture
thread exports it once stopped. The sampler thread reads Python frames only. A process that ends
(the session stopping: detach, atexit) while a trace is exported waits for that thread, up to
EXIT_WAIT_S, and the trace goes out with the session's last flush: a thread still inside torch's
C++ writer while the interpreter finalizes and the library's globals are destroyed can crash it.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import tempfile
import threading
import time

from collector.rank import session, state
from collector.rank.clock import CLOCK
from collector.rank.stack_sampler import StackSampler

log = logging.getLogger("rankscope.capture")

MAX_STEPS = 20  # longest capture a request may ask for
MAX_TRACE_BYTES = 32 << 20  # compressed; the collector accepts envelopes up to 64 MiB
EXIT_WAIT_S = 10.0  # a session ending waits this long for a trace being exported (and sent with its last flush)
KINDS = ("profile", "memory")
_EVENTS_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_BASE_NS = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


def _row(request, status: str, detail: str = "", **extra) -> dict:
    return {
        "request_id": request.id,
        "kind": request.kind,
        "status": status,
        "steps": int(request.steps),
        "reason": request.reason,
        "finding": request.finding,
        "role": request.role,
        "detail": detail,
        "time_ns": CLOCK.now_ns(),
        **extra,
    }


def answer(request, status: str, detail: str = "", **extra) -> None:
    session.emit_rows("artifacts", [_row(request, status, detail, **extra)])
    s = session.active()
    if s is not None:
        s.client.poke()  # an answer goes out now, not at the next flush


class Capture:
    """The one capture this process may be making, and the thread that ships its trace."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.request = None  # the profile request waiting for, or running across, step boundaries
        self.profiler = None
        self.sampler: StackSampler | None = None
        self.first_boundary = 0  # the step value at which the profiler started
        # the thread that started it: torch 2.13's profiler can crash the process when it is stopped
        # on another thread, so only that thread stops it
        self.thread: int | None = None
        self.captures = 0  # traces handed to the client, for tests
        self.exporting = False  # a trace is being exported (benches time the steps it overlaps)
        self.workers: list[threading.Thread] = []  # capture threads exporting or reporting (joined at the end)

    # ---- from the ack reader thread ----
    def handle(self, request) -> None:
        """Answer a request at once (accepted / refused); never blocks, never raises."""
        if request.kind not in KINDS:
            answer(request, "refused", f"unknown request kind {request.kind!r}; this rank knows {', '.join(KINDS)}")
            return
        if request.kind == "memory":
            answer(request, "accepted", "this process's memory, now")
            self._work(self._report_memory, request)
            return
        if not 1 <= request.steps <= MAX_STEPS:
            answer(request, "refused", f"steps {request.steps} is outside 1..{MAX_STEPS}")
            return
        with self._lock:
            if self.request is not None:
                refusal = f"a profiler is already active (request {self.request.id})"
            elif self.exporting:
                refusal = "a profiler is already active (the last capture's trace is still being exported)"
            elif _profiler_in_use():
                refusal = "a profiler is already active (the script's own)"
            else:
                refusal = None
                self.request = request
                state.on_step = self._on_step
        if refusal:
            answer(request, "refused", refusal)
        else:
            answer(request, "accepted", f"profiling {request.steps} step(s) from the next step boundary")

    # ---- on the training thread, at each step boundary ----
    def _on_step(self, step: int) -> None:
        try:
            if step <= 0:  # the session detaching (steps.uninstall): no boundary of training
                self._give_up("the run ended before the capture finished")
            elif self.profiler is None:
                self._start(step)
            elif step >= self.first_boundary + self.request.steps and threading.get_ident() == self.thread:
                self._stop(step)
        except Exception as exc:  # a capture never fails training
            log.exception("rankscope: profiling failed")
            self._give_up(f"the profiler failed: {exc!r}")

    def _start(self, step: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        request = self.request
        profiler = profile(activities=[ProfilerActivity.CPU], record_shapes=request.record_shapes)
        profiler.start()
        self.profiler, self.first_boundary, self.thread = profiler, step, threading.get_ident()
        if request.with_stack:
            self.sampler = StackSampler(threading.get_ident())
            self.sampler.start()

    def _stop(self, step: int) -> None:
        profiler, sampler, request, first = self.profiler, self.sampler, self.request, self.first_boundary
        profiler.stop()  # torch keeps the events in C++; nothing is parsed into Python here
        if sampler is not None:
            sampler.request_stop()  # joined on the capture thread: the training thread never waits for it
        self.exporting = True  # before the request clears: no new profiler while this one is written
        self._clear()
        self._work(self._ship, profiler, sampler, threading.get_native_id(), request, first, step - 1)

    def _work(self, target, *args) -> None:
        """``target(*args)`` on a capture thread of its own, remembered until the session ends."""
        thread = threading.Thread(target=target, args=args, name="rankscope-capture", daemon=True)
        with self._lock:
            self.workers = [t for t in self.workers if t.is_alive()] + [thread]
        thread.start()

    def _clear(self) -> None:
        with self._lock:
            state.on_step = None
            self.request, self.profiler, self.sampler = None, None, None

    def _give_up(self, detail: str) -> None:
        request, profiler, sampler = self.request, self.profiler, self.sampler
        if profiler is not None and threading.get_ident() != self.thread:
            # Not the thread that started it (e.g. the session closing from another): a profiler
            # left running beats a crashed rank; the process is ending or will not profile again.
            profiler = None
        self._clear()
        for running in (profiler, sampler):
            if running is not None:
                try:
                    running.stop()
                except Exception:
                    pass
        if request is not None:
            answer(request, "failed", detail)

    # ---- on a thread of its own ----
    def _ship(self, profiler, sampler, native_tid: int, request, first_step: int, last_step: int) -> None:
        fd, path = tempfile.mkstemp(prefix="rankscope-trace-", suffix=".json")
        os.close(fd)
        try:
            profiler.export_chrome_trace(path)
            with open(path, "rb") as f:
                raw = f.read()
            if sampler is not None:
                sampler.finish()
                raw = with_python_spans(raw, sampler, native_tid)
            data = gzip.compress(raw, compresslevel=6)  # zlib lets go of the GIL while it works
        except Exception as exc:
            log.exception("rankscope: exporting the trace failed")
            answer(request, "failed", f"exporting the trace failed: {exc!r}")
            return
        finally:
            os.unlink(path)
            self.exporting = False
        if len(data) > MAX_TRACE_BYTES:
            answer(
                request,
                "failed",
                f"trace of {len(data) >> 20} MiB compressed is over the {MAX_TRACE_BYTES >> 20} MiB bound; "
                "ask for fewer steps or without record_shapes/with_stack",
            )
            return
        self._send(request, data, first_step, last_step)

    def _report_memory(self, request) -> None:
        import torch

        report = {"rss_bytes": _rss_bytes()}
        if torch.cuda.is_initialized():
            device = torch.cuda.current_device()
            report["cuda"] = {k: v for k, v in torch.cuda.memory_stats(device).items() if isinstance(v, int)}
        step = state.get_step()
        self._send(request, gzip.compress(json.dumps(report).encode()), step, step)

    def _send(self, request, data: bytes, first_step: int, last_step: int) -> None:
        from proto import pb

        s = session.active()
        if s is None or not s.ready:
            return
        s.client.send_artifact(
            pb.Artifact(
                run_id=s.run_id,
                rank=s.rank,
                request_id=request.id,
                kind=request.kind,
                first_step=first_step,
                last_step=last_step,
                data=data,
                reason=request.reason,
                finding=request.finding,
                role=request.role,
            )
        )
        self.captures += 1

    # ---- the session ----
    def session_ending(self, wait_s: float) -> None:
        """The run ends (or this process exits) mid-capture: say so rather than leave it open."""
        if self.request is not None:
            done = state.get_step() - self.first_boundary if self.profiler is not None else 0
            self._give_up(f"the run ended after {max(done, 0)} of {self.request.steps} step(s)")
        # a trace being exported goes out with the session's last flush, and the process does not
        # finalize under a thread inside torch's writer
        deadline = time.monotonic() + EXIT_WAIT_S
        with self._lock:
            workers, self.workers = self.workers, []
        for thread in workers:
            thread.join(max(0.0, deadline - time.monotonic()))


def with_python_spans(trace: bytes, sampler: StackSampler, tid: int) -> bytes:
    """torch's exported JSON with the sampler's spans spliced in at the head of ``traceEvents``
    (text, not parsed: a trace of many operators is not rebuilt in Python)."""
    start = _EVENTS_START.search(trace)
    if start is None:
        raise ValueError("the exported trace has no traceEvents list")
    base = _BASE_NS.search(trace)
    events = sampler.chrome_events(os.getpid(), tid, int(base[1]) if base else 0)
    if not events:
        return trace
    spliced = json.dumps(events, separators=(",", ":"))[1:-1].encode()
    rest = trace[start.end() :]
    comma = b"," if rest.strip()[:1] not in (b"]", b"") else b""
    return trace[: start.end()] + spliced + comma + rest


def _profiler_in_use() -> bool:
    try:
        import torch

        return bool(torch.autograd._profiler_enabled())
    except (ImportError, AttributeError):
        return False


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


CAPTURE = Capture()


def _on_session(active: bool) -> None:
    if not active:
        CAPTURE._clear()


session.register(session.Producer("capture", flush=CAPTURE.session_ending, on_change=_on_session))
