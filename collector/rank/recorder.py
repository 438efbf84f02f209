"""The comm recorder: turns each instrumented call into one row of the ``comm`` table.

This is DeepSpeed's comms logger rebuilt for live telemetry. Unlike DeepSpeed,
calls are never synchronised to be timed:

* training thread (the hot path, <= 2 us, in collector.rank.ops): before the real
  call, ``Recorder.enter`` looks the group up (cached), takes the collective's
  ``seq`` and builds the op's record (a list), marked in flight (``inflight[id] =
  record``); after it, ``Recorder.complete`` completes the record in place, appends
  it to a bounded deque and takes it out of ``inflight``. No formatting, no
  bandwidth math, no I/O. The generated
  wrappers do the same inline (their synchronous case without a method call), so
  ``inflight``, ``pending`` and ``groups`` are cleared, never rebound.
* in flight: a collective is known from the moment it is *entered*, with its
  group, seq, op, dtype, size, entry time and step, so the watchdog
  (collector.rank.watchdog) can report a collective that never completes. A
  synchronous op leaves ``inflight`` when it returns (or raises); an async op when
  its future or ``wait()`` completes (the drain thread clears it). p2p ops are
  not marked: their seq is per direction and known only once the peer is.
* CUDA tensors get a ``torch.cuda.Event`` pair, resolved later; async ops
  (``async_op=True``, isend/irecv) are stamped when their future completes.
* a daemon thread drains the deque every 100 ms: resolves timings, computes
  bytes / algbw / busbw (collector.data.bandwidth), keeps the per-size latency
  arrays behind ``log_summary`` (collector.rank.summary), prints verbose lines
  and hands the rows to the telemetry session, if one is active.

Recording is on when ``comms_logger.enabled`` is set or a telemetry session is
active: the recorder registers with collector.rank.session, which tells it when
a session starts or ends, asks it to flush at stop and reads its dropped count.
``seq`` is the process group's own collective sequence number (``_Group``: what Flight
Recorder records as ``collective_seq_id``), the same on every rank of the group for the same
collective whichever thread or framework issued it, so rows join across ranks on
(run_id, group_name, seq); collectives issued where no wrapper sees them leave gaps.
Point-to-point ops count per direction in a pseudo-group ``p2p[src->dst]`` of
size 2, so a send joins its matching recv. The recorder owns its group cache:
``forget_groups`` after a process group is created or destroyed.
"""

from __future__ import annotations

import collections
import itertools
import logging
import sys
import threading
import time
import weakref
from array import array
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from collector.data import bandwidth
from collector.data.config import ConfigBlock
from collector.data.schema import TABLES, group_name, rank_ranges
from collector.rank import session, state
from collector.rank.clock import CLOCK, perf_ns

log = logging.getLogger("rankscope.comm")

# Function names (what the hook patches); the comm table's op is the same name, except that
# all_gather_single / reduce_scatter_single are recorded as all_gather_into_tensor /
# reduce_scatter_tensor (collector.rank.ops).
INSTRUMENTED_OPS = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "barrier",
    "all_gather_coalesced",
    "all_reduce_coalesced",
    *tuple(op for op in ("all_gather_single", "reduce_scatter_single") if hasattr(c10d, op)),
)
# ^ the *_single names replace *_into_tensor / *_tensor in newer torch (FSDP2 uses them)
P2P_OPS = frozenset(("send", "recv", "isend", "irecv"))
GROUP_SIZE = -1  # `scale` meaning "the op's data is n x this tensor"
DRAIN_INTERVAL_S = 0.1
POLL_INTERVAL_S = 0.002
MAX_PENDING = 1 << 18  # records waiting for the drain thread; beyond it they are counted and dropped
COMM_COLUMNS = tuple(name for name, _ in TABLES["comm"].columns)


@dataclass(kw_only=True)
class CommsLoggerConfig(ConfigBlock):
    """DeepSpeed's ``comms_logger`` section."""

    SECTION: ClassVar[str] = "comms_logger"
    enabled: bool = False
    verbose: bool = False
    prof_all: bool = True
    prof_ops: list[str] = field(default_factory=list)
    debug: bool = False


def get_rank(group=None) -> int:
    """Rank in ``group``; 0 without a process group (the single-rank case)."""
    return c10d.get_rank(group) if c10d.is_initialized() else 0


def get_world_size(group=None) -> int:
    return c10d.get_world_size(group) if c10d.is_initialized() else 1


class _Group:
    """What a record needs about its group, computed once per group object.
    ``members``: the group's global ranks as a range label ("0-3,8"), for in-flight reports.

    A collective's seq is ``last() + offset``, read on the calling thread just before the call:
    ``last`` is the process group's own counter (the backend's ``getSequenceNumberForGroup``:
    the number Flight Recorder records as ``collective_seq_id``), so a collective issued where
    no wrapper sees it (DDP's start-up broadcasts, its C++ reducer) leaves a gap in the rows,
    never a shift, and every thread's ops share one numbering. gloo's counter also counts
    point-to-point ops, which Flight Recorder numbers apart: each p2p op this process issues on
    the group takes one off ``offset`` (``count_p2p``). Without a backend counter (a backend
    that has none), ``last`` is a counter of our own and ``offset`` 0."""

    __slots__ = ("last", "members", "name", "offset", "p2p_in_seq", "size")

    def __init__(self, name: str, size: int, members: str = "", pg=None) -> None:
        self.name, self.size, self.members = name, size, members
        self.last, self.offset, self.p2p_in_seq = _backend_counter(pg)

    def count_p2p(self) -> None:
        if self.p2p_in_seq:
            self.offset -= 1


def _backend_counter(pg):
    """(last, offset, p2p_in_seq) for a group: its backend's collective counter where it has
    one, else a counter of our own (p2p pseudo-groups, backends without sequence numbers)."""
    if pg is not None:
        try:
            pg._get_sequence_number_for_group()
            backend = c10d.get_backend(pg)
        except Exception:  # no backend counter here: number the collectives we see
            pass
        else:
            # through a weak reference: records still queued hold this object, and they must not
            # keep the group (and gloo's threads) alive past destroy_process_group
            ref = weakref.ref(pg)

            def last() -> int:
                return ref()._get_sequence_number_for_group()

            return last, 1, backend == "gloo"  # NCCL counts collectives only (seqCollective_)
    return itertools.count(1).__next__, 0, False


class _AsyncEnd:
    """Completion time of an async op: set by its future's callback; for gloo p2p
    works (no future) when the drain thread's polling sees them completed; and for
    collectives whose Work has neither a future nor a working is_completed() (gloo's
    reduce_scatter_tensor in torch 2.13) when the caller's wait() returns, through
    _WaitTimedWork."""

    __slots__ = ("end", "timed_at_wait", "work")

    def __init__(self, work, p2p: bool) -> None:
        self.work, self.end, self.timed_at_wait = work, None, False
        try:
            work.get_future().then(self._done)
        except Exception:  # backends / ops without futures (e.g. gloo)
            self.timed_at_wait = not p2p

    def _done(self, fut) -> None:
        self.end = perf_ns()

    def resolve(self) -> int | None:
        if self.end is None and self.work.is_completed():
            self.end = perf_ns()
        if self.end is not None:
            self.work = None  # let the tensors go
        return self.end


class _WaitTimedWork(dist.Work):
    """Handed back in place of a future-less collective Work: its record ends when
    the caller's wait() returns (an upper bound of the op's end; the caller decides
    when that is). Nothing else may wait on the inner Work: gloo's wait() copies the
    result into the output, so a second wait from another thread can overwrite what
    the caller has done with the output since (seen as wrong ZeRO-1 gradients)."""

    def __init__(self, work, pending: _AsyncEnd, record: list | None = None) -> None:
        super().__init__()
        self._work, self._pending, self._record = work, pending, record

    def wait(self, *args, **kwargs):
        if self._record is not None and not self._record[SLOT_SINCE]:
            self._record[SLOT_SINCE] = perf_ns()  # the caller waits from here: the hang clock starts
        ok = self._work.wait(*args, **kwargs)
        if self._pending.end is None:
            self._pending.end = perf_ns()
        return ok

    def is_completed(self) -> bool:
        return self._pending.end is not None or self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def source_rank(self) -> int:
        return self._work.source_rank()

    def result(self):
        return self._work.result()

    def synchronize(self) -> None:
        self._work.synchronize()

    def get_future(self):
        return self._work.get_future()


class CudaSpan:
    __slots__ = ("start", "stop")

    def __init__(self, start) -> None:
        self.start, self.stop = start, None

    def resolve(self, t0: int) -> int | None:
        if not self.stop.query():
            return None
        return t0 + int(self.start.elapsed_time(self.stop) * 1e6)


def cuda_start(tensor):
    if not tensor.is_cuda:
        return None
    try:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
    except Exception:  # e.g. inside CUDA graph capture: time on the CPU instead
        return None
    return CudaSpan(ev)


# A comm record is one list, its slots named by these indexes: the one set of names the recorder, the
# generated wrappers (collector.rank.ops) and the watchdog use. A collective's record is also its
# in-flight slot: written when the op is entered (``inflight[id(record)] = record``) and completed in
# place when it returns, so the hot path builds one object, not two; the drain thread turns it into a
# ``comm`` row. A list, not a class with named ``__slots__``: the wrappers build it with one
# BUILD_LIST, and the class (bare call + a store per field) measured 0.05-0.09 us more per call in
# benches/hook_overhead, same run (issue 30).
SLOT_OP, SLOT_NAME, SLOT_GROUP, SLOT_SEQ, SLOT_DTYPE, SLOT_NUMEL, SLOT_STEP = range(7)
SLOT_T0, SLOT_T1, SLOT_SINCE, SLOT_TIMING, SLOT_ASYNC, SLOT_PEER, SLOT_KEY = range(7, 14)
# SLOT_SINCE: when the rank began waiting for it: the call, for blocking ops and for async ops whose
# completion is seen (a future); wait(), for async ops whose completion only wait() reveals (0 until
# then: the caller may do other work before it waits, which is no hang). SLOT_KEY: an async
# collective's key in ``inflight``, where it stays until its end is known. SLOT_TIMING: None (ended
# at SLOT_T1), a CudaSpan or an _AsyncEnd.


def new_record(op: str, group: _Group, seq: int, dtype, numel: int, step: int, t0: int) -> list:
    """The record of an op entered at ``t0``, nothing of its end known yet (the wrappers of
    collector.rank.ops spell the same list out inline)."""
    return [op, None, group, seq, dtype, numel, step, t0, 0, t0, None, False, -1, None]


class Recorder:
    def __init__(self) -> None:
        self.cfg = CommsLoggerConfig()
        self.on = False
        self.ops: frozenset[str] = frozenset(INSTRUMENTED_OPS)
        self.debug = False
        self.pending: collections.deque = collections.deque()
        self.waiting: list = []  # async / CUDA records not yet complete
        self.inflight: dict[int, list] = {}  # id(record) -> record: collectives entered, not yet complete
        self.abandoned: collections.deque = collections.deque(maxlen=1024)  # records whose call raised
        self.dropped = 0
        self.groups: dict = {}
        self.p2p: dict = {}
        # log_name -> bytes -> (latency ms, algbw Gbps, busbw Gbps) per instance, as compact
        # float arrays (24 bytes a record): the straggler effect needs every instance.
        self.summary: dict[str, dict[int, tuple[array, array, array]]] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()

    # ---- configuration (not hot) ----
    def refresh(self) -> None:
        cfg = self.cfg
        self.on = cfg.enabled or session.active() is not None
        self.ops = frozenset(INSTRUMENTED_OPS) if cfg.prof_all else frozenset(cfg.prof_ops)
        self.debug = cfg.debug
        if self.on and self.thread is None:
            self.thread = threading.Thread(target=self._run, name="rankscope-comm", daemon=True)
            self.thread.start()

    def forget_groups(self) -> None:
        self.groups.clear()
        self.p2p.clear()

    def _group(self, group) -> _Group:
        g = self.groups.get(group)
        if g is None:
            world = c10d.GroupMember.WORLD
            if group is None or group is world:
                # None and the WORLD object are one group (one offset for gloo's p2p): one entry
                # under each key seen; the WORLD key only once a caller passes it (a key holds it)
                g = self.groups.get(world if group is None else None)
                if g is None:
                    size = get_world_size()
                    pg = world if world is not None and c10d.is_initialized() else None
                    g = _Group("world", size, rank_ranges(list(range(size))), pg)
            else:
                ranks = sorted(c10d.get_process_group_ranks(group))
                label = rank_ranges(ranks)
                name = group_name(getattr(group, "group_desc", None), label)
                if any(o.name == name for o in self.groups.values()):  # a second communicator, same ranks
                    name += f"#{getattr(group, 'group_name', len(self.groups))}"
                g = _Group(name, len(ranks), label, group)
            self.groups[group] = g
        return g

    def _p2p(self, src: int, dst: int) -> _Group:
        key = (src, dst)
        g = self.p2p.get(key)
        if g is None:
            g = self.p2p[key] = _Group(f"p2p[{'?' if src < 0 else src}->{dst}]", 2)
        return g

    # ---- hot path ----
    def enter(self, op, grp, dtype, numel, scale) -> list:
        """A collective is about to be issued: take its seq and mark it in flight. Returns the
        record that ``complete`` (or ``abandon``, if the call raised) hands back."""
        g = self.groups.get(grp) or self._group(grp)
        if scale == GROUP_SIZE:
            scale = g.size
        rec = new_record(op, g, g.last() + g.offset, dtype, numel * scale, state.step, 0)
        self.inflight[id(rec)] = rec
        rec[SLOT_T0] = rec[SLOT_SINCE] = perf_ns()
        return rec

    def abandon(self, rec: list) -> None:
        """The real call raised (a timeout, a peer gone, a mismatch the backend caught): it is no
        longer in flight and leaves no comm record; the watchdog reports it as ``failed``."""
        self.inflight.pop(id(rec), None)
        self.abandoned.append(rec)

    def complete(self, rec: list, log_name, work, span, t1: int | None = None):
        """The real call returned (at ``t1``, read now if not given): the record is complete
        (async ones stay in flight until their end is known). Returns the Work to hand back, as
        ``record`` does. The generated wrappers do the synchronous case inline and come here for
        the rest."""
        if t1 is None:
            t1 = perf_ns()
        try:
            if span is not None:
                span.stop = torch.cuda.Event(enable_timing=True)
                span.stop.record()
            if work is None:
                del self.inflight[id(rec)]
                rec[SLOT_TIMING] = span
            else:
                timing = rec[SLOT_TIMING] = _AsyncEnd(work, False)
                if timing.timed_at_wait:
                    rec[SLOT_SINCE] = 0
                    work = _WaitTimedWork(work, timing, rec)
                rec[SLOT_KEY], rec[SLOT_ASYNC] = id(rec), True
            if self.debug:
                log_name = f"{log_name or rec[SLOT_OP]} | [Caller Func: {sys._getframe(2).f_code.co_name}]"
            rec[SLOT_NAME] = log_name or rec[SLOT_OP]
            rec[SLOT_T1] = t1
            if len(self.pending) < MAX_PENDING:
                self.pending.append(rec)
            else:
                self.inflight.pop(id(rec), None)
                self.dropped += 1
        except Exception:  # the collective itself succeeded; losing its record must not fail training
            self.inflight.pop(id(rec), None)
            self.dropped += 1
            if self.dropped == 1:
                log.exception("rankscope: could not record %s; counting it as dropped", rec[SLOT_OP])
        return work

    def count_p2p(self, group) -> None:
        """A p2p op was issued on ``group`` (recorded or not): gloo's counter moved past it."""
        try:
            (self.groups.get(group) or self._group(group)).count_p2p()
        except Exception:  # telemetry never fails training; the numbering falls back to FR's gaps
            log.debug("rankscope: could not count a p2p op", exc_info=True)

    def record(self, op, log_name, t0, work, span, dtype, numel, peer=-1, peer_is_src=False):
        """Queue a p2p op's record (its seq is per direction, known once the peer is); returns
        the Work to hand back to the caller, or None for a synchronous op."""
        t1 = perf_ns()
        try:
            if span is not None:
                span.stop = torch.cuda.Event(enable_timing=True)
                span.stop.record()
            timing = _AsyncEnd(work, True) if work is not None else span
            me = get_rank()
            g = self._p2p(peer, me) if peer_is_src else self._p2p(me, peer)
            if log_name is None:
                log_name = op
            if self.debug:
                log_name = f"{log_name} | [Caller Func: {sys._getframe(2).f_code.co_name}]"
            if len(self.pending) < MAX_PENDING:
                # new_record's list, complete (a p2p op is never in flight: SLOT_SINCE and SLOT_KEY unused)
                seq, step, is_async = g.last(), state.step, work is not None
                self.pending.append([op, log_name, g, seq, dtype, numel, step, t0, t1, 0, timing, is_async, peer, None])
            else:
                self.dropped += 1
        except Exception:  # the collective itself succeeded; losing its record must not fail training
            self.dropped += 1
            if self.dropped == 1:
                log.exception("rankscope: could not record %s; counting it as dropped", op)
        return work

    # ---- off the training thread ----
    def _run(self) -> None:
        while True:
            # Async work without a future (gloo p2p) is stamped when seen complete: look often then.
            polling = any(isinstance(r[SLOT_TIMING], _AsyncEnd) and r[SLOT_TIMING].end is None for r in self.waiting)
            self.wake.wait(POLL_INTERVAL_S if polling else DRAIN_INTERVAL_S)
            self.wake.clear()
            try:
                self.drain()
            except Exception:  # telemetry never takes the job down; say why once per burst
                log.exception("rankscope: comm records could not be processed")

    def drain(self) -> int:
        """Resolve finished records into rows; returns how many were emitted."""
        with self.lock:
            items, self.waiting = self.waiting, []
            pending = self.pending
            while pending:
                items.append(pending.popleft())
            if not items:
                return 0
            cols = {k: [] for k in COMM_COLUMNS}
            verbose = self.cfg.verbose
            rank = get_rank()
            for r in items:
                timing = r[SLOT_TIMING]
                if timing is None:
                    end = r[SLOT_T1]
                else:
                    end = timing.resolve() if isinstance(timing, _AsyncEnd) else timing.resolve(r[SLOT_T0])
                    if end is None:
                        self.waiting.append(r)
                        continue
                    if r[SLOT_KEY] is not None:  # an async collective: no longer in flight
                        self.inflight.pop(r[SLOT_KEY], None)
                g, op, numel = r[SLOT_GROUP], r[SLOT_OP], r[SLOT_NUMEL]
                # itemsize: read here, off the hot path
                nbytes = 0 if op == "barrier" else numel * r[SLOT_DTYPE].itemsize
                dur = max(0, end - r[SLOT_T0])
                algbw, busbw = bandwidth.bandwidth(op, nbytes, dur, g.size)
                cols["step"].append(r[SLOT_STEP])
                cols["group_name"].append(g.name)
                cols["group_size"].append(g.size)
                cols["seq"].append(r[SLOT_SEQ])
                cols["op"].append(op)
                cols["log_name"].append(r[SLOT_NAME])
                cols["dtype"].append(str(r[SLOT_DTYPE]).removeprefix("torch."))
                cols["numel"].append(numel)
                cols["bytes"].append(nbytes)
                cols["start_ns"].append(CLOCK.wall_ns(r[SLOT_T0]))
                cols["end_ns"].append(CLOCK.wall_ns(end))
                cols["async_op"].append(r[SLOT_ASYNC])
                cols["algbw_gbs"].append(algbw)
                cols["busbw_gbs"].append(busbw)
                cols["peer"].append(r[SLOT_PEER])
                lat_ms = dur / 1e6
                per_size = self.summary.setdefault(r[SLOT_NAME], {})
                stats = per_size.setdefault(nbytes, (array("d"), array("d"), array("d")))
                stats[0].append(lat_ms)
                stats[1].append(bandwidth.gbps(algbw))
                stats[2].append(bandwidth.gbps(busbw))
                if verbose:
                    print(
                        f"[rankscope] [Rank {rank}] rank={rank} | comm op: {r[SLOT_NAME]} | time (ms): {lat_ms:.2f} "
                        f"| msg size: {bandwidth.convert_size(nbytes)} | algbw (Gbps): {bandwidth.gbps(algbw):.2f}  "
                        f"| busbw (Gbps): {bandwidth.gbps(busbw):.2f}",
                        flush=True,
                    )
            n = len(cols["step"])
            if n:
                session.emit_columns("comm", cols, n)
            return n


REC = Recorder()


def configure(comms_logger: dict | CommsLoggerConfig | None = None) -> CommsLoggerConfig:
    """Apply DeepSpeed's ``comms_logger`` config section; bad values raise ConfigError naming them."""
    cfg = CommsLoggerConfig.from_dict(comms_logger)
    REC.cfg = cfg
    REC.refresh()
    return cfg


def flush(wait_s: float = 0.0) -> int:
    """Process every finished record now (the drain thread does this every 100 ms); with
    ``wait_s``, keep at it up to that long while async ops are still in flight."""
    deadline = time.monotonic() + wait_s
    emitted = REC.drain()
    while REC.waiting and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
        emitted += REC.drain()
    return emitted


def dropped_records() -> int:
    """Records lost so far: over the buffer bound, failed to record, or still in flight now."""
    return REC.dropped + len(REC.waiting)


def forget_groups() -> None:
    """A process group was created or destroyed: look groups up afresh."""
    REC.forget_groups()


def _forget_in_child() -> None:
    REC.on = False  # a forked child has no drain thread to empty the queue
    REC.inflight.clear()  # the parent's collectives are not the child's
    REC.abandoned.clear()


# The session tells the recorder when a session starts or ends (recording follows it), asks it
# to flush at stop (async ops may still be in flight) and counts what it dropped.
session.register(
    session.Producer(
        "comm", flush=flush, dropped=dropped_records, on_change=lambda active: REC.refresh(), on_fork=_forget_in_child
    )
)
