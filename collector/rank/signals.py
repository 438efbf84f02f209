"""Root-cause signals: what a rank records so that a straggler can be explained, not only named.

- ``gc`` rows: Python garbage-collector pauses per step and generation (count, total and
  longest pause, objects collected), from ``gc.callbacks``.
- ``host`` rows, about every ``SAMPLE_INTERVAL_S``: host CPU busy and steal shares
  (``/proc/stat``), the time this process's main thread (the training loop's) waited in the run
  queue for a CPU and the time it ran (``/proc/self/schedstat``, which is the main thread's alone:
  a noisy neighbour on its core shows as run-queue wait), its resident memory and the host's
  available memory (``/proc/meminfo``'s MemAvailable: how far an OOM is).

Cost on the training thread: the GC callback is all that runs there, and it only stamps a
clock reading into preallocated arrays (a ring of ``GC_SLOTS``); nothing is allocated, locked
or emitted from it. Everything else (reading /proc, folding pauses into per-step rows,
emitting) happens on the ``rankscope-signals`` daemon thread, which follows the session: it
starts when a session starts and stops, after a last sample, when it ends. A ring overrun
(more than GC_SLOTS pauses between two samples) loses the oldest pauses and counts them as
dropped; a missing /proc (not Linux) leaves the host rows out.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from array import array

from collector.rank import session, state
from collector.rank.clock import CLOCK

log = logging.getLogger("rankscope.telemetry")

SAMPLE_INTERVAL_S = 0.1
GC_SLOTS = 4096


class GcPauses:
    """The ``gc.callbacks`` hook and its ring of pauses (written by whichever thread collects,
    read by the sampler thread)."""

    def __init__(self, slots: int = GC_SLOTS) -> None:
        self.slots = slots
        self.step = array("q", bytes(8 * slots))
        self.generation = array("q", bytes(8 * slots))
        self.dur_ns = array("q", bytes(8 * slots))
        self.collected = array("q", bytes(8 * slots))
        self.head = 0  # pauses written so far; bumped after the slot is filled
        self.tail = 0  # pauses read so far
        self.dropped = 0
        self._started_ns = 0

    def callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started_ns = time.perf_counter_ns()
            return
        i = self.head % self.slots
        self.dur_ns[i] = time.perf_counter_ns() - self._started_ns
        self.step[i] = state.step
        self.generation[i] = info.get("generation", -1)
        self.collected[i] = info.get("collected", 0)
        self.head += 1

    def drain(self) -> list[dict]:
        """The pauses since the last drain, folded into one row per (step, generation)."""
        head = self.head
        if head - self.tail > self.slots:
            self.dropped += head - self.tail - self.slots
            self.tail = head - self.slots
        rows: dict[tuple[int, int], dict] = {}
        for n in range(self.tail, head):
            i = n % self.slots
            key = (self.step[i], self.generation[i])
            row = rows.get(key)
            if row is None:
                row = rows[key] = {"step": key[0], "generation": key[1], "count": 0, "dur_ns": 0, "max_ns": 0}
                row["collected"] = 0
            row["count"] += 1
            row["dur_ns"] += self.dur_ns[i]
            row["max_ns"] = max(row["max_ns"], self.dur_ns[i])
            row["collected"] += self.collected[i]
        self.tail = head
        return list(rows.values())


def _read_ints(path: str) -> list[int] | None:
    try:
        with open(path, "rb") as f:
            return [int(x) for x in f.read().split()[:8] if x.isdigit()]
    except OSError:
        return None


def _mem_available() -> int | None:
    """The host's MemAvailable (bytes), from /proc/meminfo: how much more it can hand out."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _host_cpu() -> tuple[int, int, int] | None:
    """(busy, steal, total) jiffies of the whole host since boot, from /proc/stat's cpu line."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0
    total = sum(fields[:8])
    return total - idle, steal, total


class HostSampler:
    """One ``host`` row per interval: deltas of the host's CPU counters and of this process's
    scheduler counters, its resident memory and the host's available memory."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.last = self._read()

    def _read(self):
        return CLOCK.now_ns(), _host_cpu(), _read_ints("/proc/self/schedstat")  # monotonic: rates stay right

    def sample(self) -> dict | None:
        now = self._read()
        (t0, cpu0, sched0), (t1, cpu1, sched1) = self.last, now
        self.last = now
        if cpu0 is None or cpu1 is None or sched0 is None or sched1 is None or len(sched1) < 2:
            return None
        busy, steal, total = (b - a for a, b in zip(cpu0, cpu1, strict=True))
        statm = _read_ints("/proc/self/statm")
        return {
            "step": state.step,
            "time_ns": t1,
            "interval_ns": t1 - t0,
            "cpu_util": busy / total if total > 0 else 0.0,
            "steal": steal / total if total > 0 else 0.0,
            "runqueue_ns": sched1[1] - sched0[1],
            "cpu_ns": sched1[0] - sched0[0],
            "rss_bytes": statm[1] * self.page if statm and len(statm) > 1 else 0,
            "mem_available_bytes": _mem_available(),
            "wall_drift_ns": CLOCK.wall_drift_ns(),
        }


class Signals:
    """The GC hook and the sampler thread, on while a session is."""

    def __init__(self) -> None:
        self.pauses = GcPauses()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sampler: HostSampler | None = None

    def on_change(self, active: bool) -> None:
        if active:
            self.start()
        else:
            self.stop()

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self.pauses.tail = self.pauses.head
            if self.pauses.callback not in gc.callbacks:
                gc.callbacks.append(self.pauses.callback)
            self._stop.clear()
            self._sampler = HostSampler()
            self._thread = threading.Thread(target=self._run, name="rankscope-signals", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=2.0)
        if self.pauses.callback in gc.callbacks:
            gc.callbacks.remove(self.pauses.callback)

    def flush(self, wait_s: float = 0.0) -> None:
        """The session is ending: stop the thread (so only this thread drains), emit the rest."""
        self.stop()
        self._emit(self._sampler.sample() if self._sampler is not None else None)
        self._sampler = None

    def _emit(self, host_row: dict | None) -> None:
        rows = self.pauses.drain()
        if rows:
            session.emit_rows("gc", rows)
        if host_row is not None:
            session.emit_rows("host", [host_row])

    def _run(self) -> None:
        sampler = self._sampler
        try:
            while sampler is not None and not self._stop.wait(SAMPLE_INTERVAL_S):
                self._emit(sampler.sample())
        except Exception:
            log.exception("rankscope: root-cause signals stopped; training goes on without them")

    def on_fork(self) -> None:
        self._thread = None  # a forked child inherits no thread
        if self.pauses.callback in gc.callbacks:
            gc.callbacks.remove(self.pauses.callback)


SIGNALS = Signals()
session.register(
    session.Producer(
        "signals",
        flush=SIGNALS.flush,
        dropped=lambda: SIGNALS.pauses.dropped,
        on_change=SIGNALS.on_change,
        on_fork=SIGNALS.on_fork,
    )
)
