"""The rank's watchdog: heartbeats, collectives stuck in flight, and Python stacks.

One daemon thread ("rankscope-watchdog") per rank process while a telemetry
session is active. It never runs on the training thread and needs nothing from
it, so it keeps beating while the training thread is blocked inside a
collective, sleeping, or busy in Python (it then waits its turn for the GIL; a
rank whose GIL is held in native code for long goes quiet, and the collector
reports it as silent or unresponsive, which is the truth).

Every ``heartbeat_s`` (default 1 s) it emits:

* one ``heartbeats`` row (time, period, how many collectives are in flight, the
  rank's ``hang_after_s``), the collector's sign of life for this rank; the last one,
  when the session stops, says ``ending``;
* one ``inflight`` row per collective in flight for longer than
  ``REPORT_AFTER_S`` (group, members, seq, op, dtype, numel, bytes, entered time,
  step), read from the recorder's in-flight slots (collector.rank.recorder). An async
  collective whose completion only its ``wait()`` reveals (gloo without futures) counts
  from that ``wait()``: until then the caller is busy elsewhere, not stuck.
  Reports repeat each beat while the collective stays in flight, so the newest
  report's ``time_ns - entered_ns`` is how long the rank has been waiting. The first
  report of a collective comes as it crosses ``REPORT_AFTER_S`` (the thread looks every
  ``LOOK_S`` and wakes for the crossing), not at the next beat: a desync (ranks in one
  collective with different shapes) is told from those reports, up to a beat sooner.
* one ``inflight`` row with ``state = 'failed'`` per collective whose call raised
  (gloo's timeout, a peer that died, a size mismatch the backend caught), so a
  collective mismatch is visible even when the backend turned it into an error.
  These are also reported when the session stops (the process is exiting).

When a collective crosses ``hang_after_s`` (collector.data.hang_rule) it wakes at that moment (not at the
next beat), reports the in-flight rows at once and captures the stacks of every
Python thread (``sys._current_frames`` + ``traceback``) into ``stacks`` with
reason ``hang``: once per stuck collective. The collector may also ask for the
stacks (``capture_stacks("requested")``, called by the client's ack reader),
which is answered from this thread too. Capturing only reads frames: the
training thread is not interrupted, whatever it is doing.

Settings: ``hang_after_s`` (``attach(hang_after_s=...)``, ``telemetry.hang_after_s``,
``RANKSCOPE_HANG_AFTER_S``; default 60 s) and ``heartbeat_s`` (``telemetry.heartbeat_s``,
``RANKSCOPE_HEARTBEAT_S``; default 1 s), resolved by collector.rank.session.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback

from collector.data import hang_rule
from collector.rank import capture, probe, session, state
from collector.rank.clock import CLOCK, perf_ns
from collector.rank.recorder import (
    REC,
    SLOT_DTYPE,
    SLOT_GROUP,
    SLOT_NUMEL,
    SLOT_OP,
    SLOT_SEQ,
    SLOT_SINCE,
    SLOT_STEP,
    SLOT_T0,
)

log = logging.getLogger("rankscope.watchdog")

REPORT_AFTER_S = 0.5  # a collective in flight this long is reported (shorter ones are business as usual)
# How often the thread looks at what is in flight between beats (a collective's entry does not wake it:
# the hot path stays one dict store), so a crossing of REPORT_AFTER_S is reported within this of it.
LOOK_S = 0.25
MAX_STACK_FRAMES = 64  # innermost frames kept per thread


def _past_report_after(items: list, now: int) -> list:
    """The (key, slot) of ``items`` (REC.inflight's) waited for at least REPORT_AFTER_S at ``now``."""
    return [(key, slot) for key, slot in items if slot[SLOT_SINCE] and now - slot[SLOT_SINCE] >= REPORT_AFTER_S * 1e9]


def _stack_rows(reason: str) -> list[dict]:
    """One row per Python thread of this process: its stack, innermost frame last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    now = CLOCK.now_ns()
    rows = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue  # the watchdog itself says nothing about the job
        frames = traceback.extract_stack(frame, limit=MAX_STACK_FRAMES)
        inner = frames[-1] if frames else None
        rows.append(
            {
                "reason": reason,
                "thread_name": names.get(ident, f"thread-{ident}"),
                "thread_id": ident,
                "is_main": ident == main,
                "stack": "".join(traceback.format_list(frames)),
                "innermost": f"{inner.filename}:{inner.lineno} in {inner.name}" if inner else "",
                "time_ns": now,
            }
        )
    return rows


class Watchdog:
    def __init__(self) -> None:
        self.hang_after_s = hang_rule.DEFAULT_HANG_AFTER_S
        self.heartbeat_s = 1.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._requests: list[str] = []  # stack captures asked for (by the collector)
        self._hung: set[int] = set()  # slots whose stacks were captured already
        self._reported: set[int] = set()  # slots reported in flight at least once
        self.captures = 0  # stack captures made, for tests and diagnostics

    def start(self, hang_after_s: float, heartbeat_s: float) -> None:
        self.hang_after_s, self.heartbeat_s = hang_after_s, heartbeat_s
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="rankscope-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)

    def request_stacks(self, reason: str = "requested") -> None:
        """Ask for a stack capture from the watchdog thread (safe from any thread, never blocks)."""
        self._requests.append(reason)
        self._wake.set()

    def _run(self) -> None:
        next_beat = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_beat:
                    self.beat()
                    next_beat = now + self.heartbeat_s
                self._check_hangs()
                self._report_crossed()
                self.report_failed()
                while self._requests:
                    self.capture_stacks(self._requests.pop(0))
            except Exception:  # telemetry never takes the job down
                log.exception("rankscope: watchdog check failed")
            self._wake.wait(max(0.01, min(next_beat - time.monotonic(), self._next_due_in())))
            self._wake.clear()

    def _next_due_in(self) -> float:
        """Seconds until the next collective in flight crosses REPORT_AFTER_S unreported, or
        hang_after_s not yet hung; LOOK_S at most (a collective entered meanwhile)."""
        now = perf_ns()
        due = []
        for key, slot in list(REC.inflight.items()):
            if not slot[SLOT_SINCE]:
                continue
            if key not in self._reported:
                due.append((slot[SLOT_SINCE] + REPORT_AFTER_S * 1e9 - now) / 1e9)
            if key not in self._hung:
                due.append((slot[SLOT_SINCE] + self.hang_after_s * 1e9 - now) / 1e9)
        return min([*due, LOOK_S])

    def _report_crossed(self) -> None:
        """Report the collectives that crossed REPORT_AFTER_S since the last look (the rest of
        their reports come with the beats)."""
        items = list(REC.inflight.items())
        self._reported &= {key for key, _ in items}  # forget collectives that completed
        crossed = [(key, slot) for key, slot in _past_report_after(items, perf_ns()) if key not in self._reported]
        if crossed:
            self._reported.update(key for key, _ in crossed)
            self._report([slot for _, slot in crossed], REPORT_AFTER_S)

    def beat(self, ending: bool = False) -> None:
        """One heartbeat and the in-flight report; ``ending``: the last one, the session is stopping
        (its RunEnd follows), so the silence after it is no alarm."""
        items = list(REC.inflight.items())
        slots = [slot for _, slot in items]
        session.emit(
            "heartbeats",
            time_ns=CLOCK.now_ns(),
            period_s=self.heartbeat_s,
            inflight=len(slots),
            hang_after_s=self.hang_after_s,
            ending=ending,
        )
        now = perf_ns()  # before the report's own: a slot this old is in it
        self._report(slots, REPORT_AFTER_S)
        self._reported.update(key for key, _ in _past_report_after(items, now))

    def report_failed(self) -> int:
        """Report the collectives whose call raised since the last look."""
        slots = []
        while REC.abandoned:
            slots.append(REC.abandoned.popleft())
        return self._report(slots, 0.0, "failed") if slots else 0

    def _report(self, slots: list, older_than_s: float, state_: str = "waiting") -> int:
        now = perf_ns()
        now_ns = CLOCK.now_ns()
        rows = []
        for slot in slots:
            t0 = slot[SLOT_SINCE] or (slot[SLOT_T0] if state_ == "failed" else 0)
            if not t0 or now - t0 < older_than_s * 1e9:
                continue
            g, dtype = slot[SLOT_GROUP], slot[SLOT_DTYPE]
            op = slot[SLOT_OP]
            rows.append(
                {
                    "step": slot[SLOT_STEP],
                    "group_name": g.name,
                    "group_size": g.size,
                    "group_ranks": g.members,
                    "seq": slot[SLOT_SEQ],
                    "op": op,
                    "dtype": str(dtype).removeprefix("torch."),
                    "numel": slot[SLOT_NUMEL],
                    "bytes": 0 if op == "barrier" else slot[SLOT_NUMEL] * dtype.itemsize,
                    "entered_ns": CLOCK.wall_ns(t0),
                    "time_ns": now_ns,
                    "hang_after_s": self.hang_after_s,
                    "state": state_,
                }
            )
        if rows:
            session.emit_rows("inflight", rows)
            s = session.active()
            if s is not None:
                s.client.poke()  # a stuck collective is news: ship it now, not at the next flush
        return len(rows)

    def _check_hangs(self) -> None:
        now = perf_ns()
        items = list(REC.inflight.items())
        self._hung &= {key for key, _ in items}  # forget collectives that completed
        fresh = [
            slot
            for key, slot in items
            if key not in self._hung
            and slot[SLOT_SINCE]
            and hang_rule.is_hung((now - slot[SLOT_SINCE]) / 1e9, self.hang_after_s)
        ]
        if not fresh:
            return
        self._hung.update(id(slot) for slot in fresh)
        self._report([slot for _, slot in items], REPORT_AFTER_S)
        worst = min(fresh, key=lambda slot: slot[SLOT_SINCE])
        g = worst[SLOT_GROUP]
        self.capture_stacks(f"hang: {worst[SLOT_OP]} {g.name} #{worst[SLOT_SEQ]} in flight > {self.hang_after_s:g} s")

    def capture_stacks(self, reason: str) -> int:
        """Emit every thread's stack now (from this thread); returns how many threads."""
        rows = _stack_rows(reason)
        step = state.step
        for row in rows:
            row["step"] = step
        session.emit_rows("stacks", rows)
        s = session.active()
        if s is not None:
            s.client.poke()
        self.captures += 1
        return len(rows)


WATCHDOG = Watchdog()


def _on_session(active: bool) -> None:
    s = session.active()
    if active and s is not None:
        s.client.on_request = _on_request
        WATCHDOG.start(s.hang_after_s, s.heartbeat_s)
    elif not active:
        WATCHDOG.stop()
        probe.PROBE.close()


def _on_request(request) -> None:
    """The collector asked (on the client's ack reader thread): stacks are queued for the watchdog,
    the rest is collector.rank.capture's; a request with an id (a command) is answered in artifacts."""
    if request.kind == "stacks":
        WATCHDOG.request_stacks(request.reason or "requested")
        if request.id:
            capture.answer(request, "accepted", "every Python thread's stack, in the stacks table")
    elif request.kind in probe.KINDS:
        probe.PROBE.handle(request)
    else:
        capture.CAPTURE.handle(request)


def _forget_in_child() -> None:
    WATCHDOG._thread = None  # a forked child inherits no thread


def _flush(wait_s: float) -> None:
    """The session is stopping: report what failed (the process may be exiting because of that very
    collective) and say goodbye, so the quiet while RunEnd is on its way is not taken for silence."""
    WATCHDOG.report_failed()
    WATCHDOG.beat(ending=True)


session.register(session.Producer("watchdog", flush=_flush, on_change=_on_session, on_fork=_forget_in_child))
