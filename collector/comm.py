"""Instrumented torch.distributed: the same functions and signatures (plus an
optional ``log_name=``), each call recorded as one row of the ``comm`` table.

This is DeepSpeed's comms logger (seed 000) rebuilt for live telemetry:
``configure({"enabled", "verbose", "prof_all", "prof_ops", "debug"})`` and
``log_summary(show_straggler=False, return_dict=False)`` behave as there. Unlike
DeepSpeed, calls are never synchronised to be timed:

* training thread (the hot path, ~1 us): two ``perf_counter_ns`` reads around
  the real call, a cached per-group lookup, and one tuple appended to a bounded
  deque. No formatting, no bandwidth math, no I/O.
* CUDA tensors get a ``torch.cuda.Event`` pair, resolved later; async ops
  (``async_op=True``, isend/irecv) are stamped when their future completes.
* a daemon thread drains the deque every 100 ms: resolves timings, computes
  bytes / algbw / busbw (collector.bandwidth), updates the summary, prints
  verbose lines and hands the rows to the telemetry session, if one is active.

Recording is on when ``comms_logger.enabled`` is set or a telemetry session is
active (``collector.hook.attach`` / the engine). ``seq`` counts collectives per
group and is the same on every rank of the group for the same collective, so
rows join across ranks on (run_id, group_name, seq). Point-to-point ops count
per direction in a pseudo-group ``p2p[src->dst]`` of size 2, so a send joins
its matching recv.

The real functions are called from ``torch.distributed.distributed_c10d``,
which ``hook.attach`` never patches, so nothing is recorded twice.
"""
from __future__ import annotations

import collections
import itertools
import logging
import math
import sys
import threading
import time
from array import array
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from collector import bandwidth, telemetry
from collector.clock import CLOCK, perf_ns

log = logging.getLogger("rankscope.comm")

# Pass-throughs the engine and scripts need next to the collectives.
ReduceOp = dist.ReduceOp
group = dist.group
P2POp = dist.P2POp
is_available = dist.is_available
is_initialized = c10d.is_initialized
get_backend = c10d.get_backend
new_group = c10d.new_group
get_global_rank = c10d.get_global_rank
get_process_group_ranks = c10d.get_process_group_ranks
all_gather_object = c10d.all_gather_object
broadcast_object_list = c10d.broadcast_object_list
monitored_barrier = c10d.monitored_barrier


def get_rank(group=None) -> int:
    """Rank in ``group``; 0 without a process group (the single-rank case)."""
    return c10d.get_rank(group) if c10d.is_initialized() else 0


def get_world_size(group=None) -> int:
    return c10d.get_world_size(group) if c10d.is_initialized() else 1


def init_process_group(*args, **kwargs):
    c10d.init_process_group(*args, **kwargs)
    _REC.forget_groups()
    telemetry.on_process_group()


def destroy_process_group(group=None):
    c10d.destroy_process_group(group)
    _REC.forget_groups()


INSTRUMENTED_OPS = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "broadcast", "reduce", "gather", "scatter", "send", "recv",
    "isend", "irecv", "barrier", "all_gather_coalesced", "all_reduce_coalesced",
) + tuple(op for op in ("all_gather_single", "reduce_scatter_single") if hasattr(c10d, op))
# ^ the *_single names replace *_into_tensor / *_tensor in newer torch (FSDP2 uses them)
_P2P_OPS = frozenset(("send", "recv", "isend", "irecv"))
_GROUP_SIZE = -1  # `scale` meaning "the op's data is n x this tensor"
_DRAIN_INTERVAL_S = 0.1
_POLL_INTERVAL_S = 0.002
_MAX_PENDING = 1 << 18  # records waiting for the drain thread; beyond it they are counted and dropped


@dataclass(kw_only=True)
class CommsLoggerConfig:
    """DeepSpeed's ``comms_logger`` section."""
    enabled: bool = False
    verbose: bool = False
    prof_all: bool = True
    prof_ops: list[str] = field(default_factory=list)
    debug: bool = False

    def __post_init__(self) -> None:
        for key in ("enabled", "verbose", "prof_all", "debug"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"comms_logger.{key} must be true or false, got {getattr(self, key)!r}")
        if not isinstance(self.prof_ops, (list, tuple)) or not all(isinstance(o, str) for o in self.prof_ops):
            raise ValueError(f"comms_logger.prof_ops must be a list of op names, got {self.prof_ops!r}")
        self.prof_ops = list(self.prof_ops)

    @classmethod
    def from_dict(cls, d: dict | None) -> "CommsLoggerConfig":
        return telemetry.config_from_dict(cls, d, "comms_logger")


class _Group:
    """What a record needs about its group, computed once per group object."""
    __slots__ = ("name", "size", "seq")

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size, self.seq = name, size, itertools.count(1)


def _ranks_label(ranks: list[int]) -> str:
    """[0,1,2,3,8] -> '0-3,8': stable, readable, short for big contiguous groups."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(parts)


class _AsyncEnd:
    """Completion time of an async op: set by its future's callback; for gloo p2p
    works (no future) when the drain thread's polling sees them completed; and for
    collectives whose Work has neither a future nor a working is_completed() (gloo's
    reduce_scatter_tensor in torch 2.13) when the caller's wait() returns, through
    _WaitTimedWork."""
    __slots__ = ("work", "end", "timed_at_wait")

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

    def __init__(self, work, pending: _AsyncEnd) -> None:
        super().__init__()
        self._work, self._pending = work, pending

    def wait(self, *args, **kwargs):
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


class _CudaSpan:
    __slots__ = ("start", "stop")

    def __init__(self, start) -> None:
        self.start, self.stop = start, None

    def resolve(self, t0: int) -> int | None:
        if not self.stop.query():
            return None
        return t0 + int(self.start.elapsed_time(self.stop) * 1e6)


def _cuda_start(tensor):
    if not tensor.is_cuda:
        return None
    try:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
    except Exception:  # e.g. inside CUDA graph capture: time on the CPU instead
        return None
    return _CudaSpan(ev)


# record tuple fields
(_OP, _NAME, _GROUP, _SEQ, _DTYPE, _NUMEL, _ITEMSIZE, _T0, _T1, _TIMING, _ASYNC, _PEER, _STEP) = range(13)


class _Recorder:
    def __init__(self) -> None:
        self.cfg = CommsLoggerConfig()
        self.on = False
        self.ops: frozenset[str] = frozenset(INSTRUMENTED_OPS)
        self.debug = False
        self.pending: collections.deque = collections.deque()
        self.waiting: list = []  # async / CUDA records not yet complete
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
        self.on = cfg.enabled or telemetry.session() is not None
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
            if group is None or group is c10d.GroupMember.WORLD:
                g = _Group("world", get_world_size())
            else:
                ranks = sorted(c10d.get_process_group_ranks(group))
                name = f"g[{_ranks_label(ranks)}]"
                if any(o.name == name for o in self.groups.values()):  # a second communicator, same ranks
                    name += f"#{getattr(group, 'group_name', len(self.groups))}"
                g = _Group(name, len(ranks))
            self.groups[group] = g
        return g

    def _p2p(self, src: int, dst: int) -> _Group:
        key = (src, dst)
        g = self.p2p.get(key)
        if g is None:
            g = self.p2p[key] = _Group(f"p2p[{'?' if src < 0 else src}->{dst}]", 2)
        return g

    # ---- hot path ----
    def record(self, op, log_name, grp, t0, work, span, dtype, numel, scale, peer=-1, peer_is_src=False):
        """Queue the op's record; returns the Work to hand back to the caller (``work`` itself,
        or a _WaitTimedWork around it), or None for a synchronous op."""
        t1 = perf_ns()
        try:
            if span is not None:
                span.stop = torch.cuda.Event(enable_timing=True)
                span.stop.record()
            timing = _AsyncEnd(work, op in _P2P_OPS) if work is not None else span
            if work is not None and timing.timed_at_wait:
                work = _WaitTimedWork(work, timing)
            if op in _P2P_OPS:
                me = get_rank()
                g = self._p2p(peer, me) if peer_is_src else self._p2p(me, peer)
            else:
                g = self.groups.get(grp) or self._group(grp)
                if scale == _GROUP_SIZE:
                    scale = g.size
            if log_name is None:
                log_name = op
            if self.debug:
                log_name = f"{log_name} | [Caller Func: {sys._getframe(2).f_code.co_name}]"
            if len(self.pending) < _MAX_PENDING:
                self.pending.append((op, log_name, g, next(g.seq), dtype, numel * scale, dtype.itemsize, t0, t1,
                                     timing, work is not None, peer, telemetry._step))
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
            polling = any(isinstance(r[_TIMING], _AsyncEnd) and r[_TIMING].end is None for r in self.waiting)
            self.wake.wait(_POLL_INTERVAL_S if polling else _DRAIN_INTERVAL_S)
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
            cols = {k: [] for k in telemetry.comm_columns()}
            verbose = self.cfg.verbose
            rank = get_rank()
            for r in items:
                timing = r[_TIMING]
                if timing is None:
                    end = r[_T1]
                else:
                    end = timing.resolve() if isinstance(timing, _AsyncEnd) else timing.resolve(r[_T0])
                    if end is None:
                        self.waiting.append(r)
                        continue
                g, op, numel = r[_GROUP], r[_OP], r[_NUMEL]
                nbytes = 0 if op == "barrier" else numel * r[_ITEMSIZE]
                dur = max(0, end - r[_T0])
                algbw, busbw = bandwidth.bandwidth(op, nbytes, dur, g.size)
                cols["step"].append(r[_STEP])
                cols["group_name"].append(g.name)
                cols["group_size"].append(g.size)
                cols["seq"].append(r[_SEQ])
                cols["op"].append(op)
                cols["log_name"].append(r[_NAME])
                cols["dtype"].append(str(r[_DTYPE]).removeprefix("torch."))
                cols["numel"].append(numel)
                cols["bytes"].append(nbytes)
                cols["start_ns"].append(CLOCK.wall_ns(r[_T0]))
                cols["end_ns"].append(CLOCK.wall_ns(end))
                cols["async_op"].append(r[_ASYNC])
                cols["algbw_gbs"].append(algbw)
                cols["busbw_gbs"].append(busbw)
                cols["peer"].append(r[_PEER])
                lat_ms = dur / 1e6
                stats = self.summary.setdefault(r[_NAME], {}).setdefault(nbytes, (array("d"), array("d"), array("d")))
                stats[0].append(lat_ms)
                stats[1].append(bandwidth.gbps(algbw))
                stats[2].append(bandwidth.gbps(busbw))
                if verbose:
                    print(f"[rankscope] [Rank {rank}] rank={rank} | comm op: {r[_NAME]} | time (ms): {lat_ms:.2f} "
                          f"| msg size: {convert_size(nbytes)} | algbw (Gbps): {bandwidth.gbps(algbw):.2f}  "
                          f"| busbw (Gbps): {bandwidth.gbps(busbw):.2f}", flush=True)
            n = len(cols["step"])
            if n:
                telemetry.emit_columns("comm", cols, n)
            return n


_REC = _Recorder()


def configure(comms_logger: dict | CommsLoggerConfig | None = None) -> CommsLoggerConfig:
    """Apply DeepSpeed's ``comms_logger`` config section; bad keys raise ValueError naming them."""
    cfg = comms_logger if isinstance(comms_logger, CommsLoggerConfig) else CommsLoggerConfig.from_dict(comms_logger)
    _REC.cfg = cfg
    _REC.refresh()
    return cfg


def flush(wait_s: float = 0.0) -> int:
    """Process every finished record now (the drain thread does this every 100 ms); with
    ``wait_s``, keep at it up to that long while async ops are still in flight."""
    deadline = time.monotonic() + wait_s
    emitted = _REC.drain()
    while _REC.waiting and time.monotonic() < deadline:
        time.sleep(_POLL_INTERVAL_S)
        emitted += _REC.drain()
    return emitted


def dropped_records() -> int:
    """Records lost so far: over the buffer bound, failed to record, or still in flight now."""
    return _REC.dropped + len(_REC.waiting)


# ---------------------------------------------------------------------------
# The instrumented surface. Each wrapper: skip when off; else time the real call
# and hand the cheap facts to _REC.record. Signatures mirror torch.distributed.

def _skip(op: str, log_name: str | None) -> bool:
    # prof_ops may list op names or log_names (DeepSpeed matches log_name)
    return not _REC.on or (op not in _REC.ops and log_name not in _REC.ops)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, log_name=None):
    if _skip("all_reduce", log_name):
        return c10d.all_reduce(tensor, op, group, async_op)
    span = _cuda_start(tensor)
    t0 = perf_ns()
    work = c10d.all_reduce(tensor, op, group, async_op)
    work = _REC.record("all_reduce", log_name, group, t0, work if async_op else None, span, tensor.dtype, tensor.numel(), 1)
    return work


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op=False, log_name=None):
    if _skip("all_reduce_coalesced", log_name) or not tensors:
        return c10d.all_reduce_coalesced(tensors, op, group, async_op)
    span = _cuda_start(tensors[0])
    t0 = perf_ns()
    work = c10d.all_reduce_coalesced(tensors, op, group, async_op)
    work = _REC.record("all_reduce_coalesced", log_name, group, t0, work if async_op else None, span, tensors[0].dtype,
                       sum(t.numel() for t in tensors), 1)
    return work


def all_gather(tensor_list, tensor, group=None, async_op=False, log_name=None):
    if _skip("all_gather", log_name):
        return c10d.all_gather(tensor_list, tensor, group, async_op)
    span = _cuda_start(tensor)
    t0 = perf_ns()
    work = c10d.all_gather(tensor_list, tensor, group, async_op)
    work = _REC.record("all_gather", log_name, group, t0, work if async_op else None, span, tensor.dtype, tensor.numel(),
                       len(tensor_list))
    return work


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, log_name=None):
    if _skip("all_gather_into_tensor", log_name):
        return c10d.all_gather_into_tensor(output_tensor, input_tensor, group, async_op)
    span = _cuda_start(input_tensor)
    t0 = perf_ns()
    work = c10d.all_gather_into_tensor(output_tensor, input_tensor, group, async_op)
    work = _REC.record("all_gather_into_tensor", log_name, group, t0, work if async_op else None, span, output_tensor.dtype,
                       output_tensor.numel(), 1)
    return work


if "all_gather_single" in INSTRUMENTED_OPS:
    def all_gather_single(output_tensor, input_tensor, group=None, async_op=False, log_name=None):
        if _skip("all_gather_single", log_name):
            return c10d.all_gather_single(output_tensor, input_tensor, group, async_op)
        span = _cuda_start(input_tensor)
        t0 = perf_ns()
        work = c10d.all_gather_single(output_tensor, input_tensor, group, async_op)
        work = _REC.record("all_gather_single", log_name, group, t0, work if async_op else None, span,
                           output_tensor.dtype, output_tensor.numel(), 1)
        return work


if "reduce_scatter_single" in INSTRUMENTED_OPS:
    def reduce_scatter_single(output, input, op=ReduceOp.SUM, group=None, async_op=False, log_name=None):
        if _skip("reduce_scatter_single", log_name):
            return c10d.reduce_scatter_single(output, input, op, group, async_op)
        span = _cuda_start(input)
        t0 = perf_ns()
        work = c10d.reduce_scatter_single(output, input, op, group, async_op)
        work = _REC.record("reduce_scatter_single", log_name, group, t0, work if async_op else None, span, input.dtype,
                           input.numel(), 1)
        return work


def all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None, async_op=False, log_name=None):
    if _skip("all_gather_coalesced", log_name) or not input_tensor_list:
        return c10d.all_gather_coalesced(output_tensor_lists, input_tensor_list, group, async_op)
    span = _cuda_start(input_tensor_list[0])
    t0 = perf_ns()
    work = c10d.all_gather_coalesced(output_tensor_lists, input_tensor_list, group, async_op)
    work = _REC.record("all_gather_coalesced", log_name, group, t0, work if async_op else None, span,
                       input_tensor_list[0].dtype, sum(t.numel() for out in output_tensor_lists for t in out), 1)
    return work


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False, log_name=None):
    if _skip("reduce_scatter", log_name):
        return c10d.reduce_scatter(output, input_list, op, group, async_op)
    span = _cuda_start(output)
    t0 = perf_ns()
    work = c10d.reduce_scatter(output, input_list, op, group, async_op)
    work = _REC.record("reduce_scatter", log_name, group, t0, work if async_op else None, span, output.dtype,
                       sum(t.numel() for t in input_list), 1)
    return work


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, log_name=None):
    if _skip("reduce_scatter_tensor", log_name):
        return c10d.reduce_scatter_tensor(output, input, op, group, async_op)
    span = _cuda_start(input)
    t0 = perf_ns()
    work = c10d.reduce_scatter_tensor(output, input, op, group, async_op)
    work = _REC.record("reduce_scatter_tensor", log_name, group, t0, work if async_op else None, span, input.dtype,
                       input.numel(), 1)
    return work


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, log_name=None):
    if _skip("all_to_all", log_name) or not input_tensor_list:
        return c10d.all_to_all(output_tensor_list, input_tensor_list, group, async_op)
    span = _cuda_start(input_tensor_list[0])
    t0 = perf_ns()
    work = c10d.all_to_all(output_tensor_list, input_tensor_list, group, async_op)
    work = _REC.record("all_to_all", log_name, group, t0, work if async_op else None, span, input_tensor_list[0].dtype,
                       sum(t.numel() for t in input_tensor_list), 1)
    return work


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False,
                      log_name=None):
    if _skip("all_to_all_single", log_name):
        return c10d.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op)
    span = _cuda_start(input)
    t0 = perf_ns()
    work = c10d.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op)
    work = _REC.record("all_to_all_single", log_name, group, t0, work if async_op else None, span, input.dtype,
                       input.numel(), 1)
    return work


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None, log_name=None):
    if _skip("broadcast", log_name):
        return c10d.broadcast(tensor, src, group, async_op, group_src)
    span = _cuda_start(tensor)
    t0 = perf_ns()
    work = c10d.broadcast(tensor, src, group, async_op, group_src)
    work = _REC.record("broadcast", log_name, group, t0, work if async_op else None, span, tensor.dtype, tensor.numel(), 1)
    return work


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None, log_name=None):
    if _skip("reduce", log_name):
        return c10d.reduce(tensor, dst, op, group, async_op, group_dst)
    span = _cuda_start(tensor)
    t0 = perf_ns()
    work = c10d.reduce(tensor, dst, op, group, async_op, group_dst)
    work = _REC.record("reduce", log_name, group, t0, work if async_op else None, span, tensor.dtype, tensor.numel(), 1)
    return work


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None, log_name=None):
    if _skip("gather", log_name):
        return c10d.gather(tensor, gather_list, dst, group, async_op, group_dst)
    span = _cuda_start(tensor)
    t0 = perf_ns()
    work = c10d.gather(tensor, gather_list, dst, group, async_op, group_dst)
    work = _REC.record("gather", log_name, group, t0, work if async_op else None, span, tensor.dtype, tensor.numel(),
                       _GROUP_SIZE)
    return work


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None, log_name=None):
    if _skip("scatter", log_name):
        return c10d.scatter(tensor, scatter_list, src, group, async_op, group_src)
    span = _cuda_start(tensor)
    t0 = perf_ns()
    work = c10d.scatter(tensor, scatter_list, src, group, async_op, group_src)
    work = _REC.record("scatter", log_name, group, t0, work if async_op else None, span, tensor.dtype, tensor.numel(),
                       _GROUP_SIZE)
    return work


def barrier(group=None, async_op=False, device_ids=None, timeout=None, log_name=None):
    if _skip("barrier", log_name):
        return c10d.barrier(group, async_op, device_ids, timeout)
    t0 = perf_ns()
    work = c10d.barrier(group, async_op, device_ids, timeout)
    work = _REC.record("barrier", log_name, group, t0, work if async_op else None, None, torch.uint8, 0, 1)
    return work


def _global_peer(group, peer, group_peer) -> int:
    if peer is None and group_peer is not None:
        return c10d.get_global_rank(group, group_peer) if group is not None else group_peer
    return -1 if peer is None else peer


def send(tensor, dst=None, group=None, tag=0, group_dst=None, log_name=None):
    if _skip("send", log_name):
        return c10d.send(tensor, dst, group, tag, group_dst)
    span = _cuda_start(tensor)
    t0 = perf_ns()
    c10d.send(tensor, dst, group, tag, group_dst)
    _REC.record("send", log_name, group, t0, None, span, tensor.dtype, tensor.numel(), 1,
                _global_peer(group, dst, group_dst))


def recv(tensor, src=None, group=None, tag=0, group_src=None, log_name=None):
    if _skip("recv", log_name):
        return c10d.recv(tensor, src, group, tag, group_src)
    span = _cuda_start(tensor)
    t0 = perf_ns()
    sender = c10d.recv(tensor, src, group, tag, group_src)
    _REC.record("recv", log_name, group, t0, None, span, tensor.dtype, tensor.numel(), 1, sender, True)
    return sender


def isend(tensor, dst=None, group=None, tag=0, group_dst=None, log_name=None):
    if _skip("isend", log_name):
        return c10d.isend(tensor, dst, group, tag, group_dst)
    t0 = perf_ns()
    work = c10d.isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work = _REC.record("isend", log_name, group, t0, work, None, tensor.dtype, tensor.numel(), 1,
                           _global_peer(group, dst, group_dst))
    return work


def irecv(tensor, src=None, group=None, tag=0, group_src=None, log_name=None):
    if _skip("irecv", log_name):
        return c10d.irecv(tensor, src, group, tag, group_src)
    t0 = perf_ns()
    work = c10d.irecv(tensor, src, group, tag, group_src)
    if work is not None:
        work = _REC.record("irecv", log_name, group, t0, work, None, tensor.dtype, tensor.numel(), 1,
                           _global_peer(group, src, group_src), True)
    return work


batch_isend_irecv = c10d.batch_isend_irecv  # not instrumented: its ops are issued inside c10d


# ---------------------------------------------------------------------------
# Summary (DeepSpeed's log_summary table)

def convert_size(size_bytes: int) -> str:
    """DeepSpeed's message-size label: binary units, two decimals ('2.0 KB', '678.86 MB')."""
    if size_bytes == 0:
        return "0B"
    names = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
    i = int(math.floor(math.log(size_bytes, 1024)))
    return f"{round(size_bytes / math.pow(1024, i), 2)} {names[i]}"


def trim_mean(values: list[float], proportion: float = 0.1) -> float:
    """Mean without the top and bottom ``proportion`` (DeepSpeed drops outliers the same way)."""
    if not values:
        return 0.0
    cut = int(len(values) * proportion)
    kept = sorted(values)[cut:len(values) - cut] or sorted(values)
    return sum(kept) / len(kept)


def _straggler_min_latencies(keys: list[tuple[str, int]]) -> dict[tuple[str, int], list[float]]:
    """Per (name, size), the MIN over all ranks of each instance's latency.

    Collective over the default group. Ranks may have recorded different ops
    (sub-groups), so the key set is agreed first and missing instances count
    as +inf, which MIN ignores."""
    world = get_world_size()
    if world == 1:
        return {k: list(_REC.summary[k[0]][k[1]][0]) for k in keys}
    from collector.clock import _collective_device
    device = _collective_device()
    gathered: list = [None] * world
    c10d.all_gather_object(gathered, keys)
    union = sorted(set(k for ks in gathered for k in ks))
    counts = torch.tensor([len(_REC.summary.get(k[0], {}).get(k[1], [[]])[0]) for k in union], dtype=torch.int64,
                          device=device)
    c10d.all_reduce(counts, op=ReduceOp.MAX)
    counts_l = counts.tolist()
    flat = torch.full((sum(counts_l),), math.inf, dtype=torch.float64, device=device)
    offsets, at = [], 0
    for k, c in zip(union, counts_l):
        own = _REC.summary.get(k[0], {}).get(k[1], [[]])[0]
        flat[at:at + len(own)] = torch.tensor(list(own), dtype=torch.float64)
        offsets.append(at)
        at += c
    c10d.all_reduce(flat, op=ReduceOp.MIN)
    mins = flat.tolist()
    return {k: mins[o:o + len(_REC.summary.get(k[0], {}).get(k[1], [[]])[0])] for k, o in zip(union, offsets)}


def log_summary(show_straggler: bool = False, return_dict: bool = False):
    """Print (on rank 0) DeepSpeed's comms summary for this rank's records (grouped by
    log_name, which carries the caller in debug mode), by message size.

    show_straggler adds, per op and size, the straggler effect: sum over
    instances of (this rank's latency - the minimum across ranks). That needs a
    collective, so with show_straggler every rank must call log_summary.
    Returns {log_name: {msg_size_bytes: {stats}}} when return_dict."""
    flush()
    keys = sorted((name, size) for name, sizes in _REC.summary.items() for size in sizes)
    mins = _straggler_min_latencies(keys) if show_straggler else {}
    out: dict[str, dict[int, dict]] = {}
    if show_straggler:
        header = ("Comm. Op", "Message Size", "Count", "Total comm lat(ms)", "Total straggler(ms)",
                  "Avg comm lat(ms)", "Avg straggler(ms)")
    else:
        header = ("Comm. Op", "Message Size", "Count", "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)",
                  "busbw_avg (Gbps)")
    lines = ["".join(f"{h:<20}" for h in header)]
    last = None
    for name, size in keys:
        lats, algbws, busbws = _REC.summary[name][size]
        stats = {
            "count": len(lats), "total_latency_ms": sum(lats), "avg_latency_ms": trim_mean(lats),
            "tput_avg_gbps": trim_mean(algbws), "busbw_avg_gbps": trim_mean(busbws),
        }
        if show_straggler:
            strag = [max(0.0, own - m) for own, m in zip(lats, mins.get((name, size), lats))]
            stats["total_straggler_ms"] = sum(strag)
            stats["avg_straggler_ms"] = trim_mean(strag)
        out.setdefault(name, {})[size] = stats
        if name != last:
            lines.append(name)
            last = name
        if show_straggler:
            row = ("", convert_size(size), stats["count"], f"{stats['total_latency_ms']:.2f}",
                   f"{stats['total_straggler_ms']:.2f}", f"{stats['avg_latency_ms']:.2f}",
                   f"{stats['avg_straggler_ms']:.2f}")
        else:
            row = ("", convert_size(size), stats["count"], f"{stats['total_latency_ms']:.2f}",
                   f"{stats['avg_latency_ms']:.2f}", f"{stats['tput_avg_gbps']:.2f}", f"{stats['busbw_avg_gbps']:.2f}")
        lines.append("".join(f"{str(c):<20}" for c in row))
    if get_rank() == 0:  # as DeepSpeed: every rank computes, rank 0 prints
        print("\n".join(lines), flush=True)
    return out if return_dict else None


def reset_summary() -> None:
    with _REC.lock:
        _REC.summary.clear()


__all__ = [
    *INSTRUMENTED_OPS, "batch_isend_irecv",
    "ReduceOp", "group", "P2POp", "is_available", "is_initialized", "get_backend", "new_group", "get_global_rank",
    "get_process_group_ranks", "all_gather_object", "broadcast_object_list", "monitored_barrier", "get_rank",
    "get_world_size", "init_process_group", "destroy_process_group",
    "CommsLoggerConfig", "INSTRUMENTED_OPS", "configure", "flush", "dropped_records", "log_summary",
    "reset_summary", "convert_size", "trim_mean",
]
