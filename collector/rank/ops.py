"""Instrumented torch.distributed: the same functions and signatures (plus an
optional ``log_name=``), each call recorded as one row of the ``comm`` table.

Every wrapper is made by one factory from a one-line ``OpSpec`` (which argument
carries the dtype and device, how many elements the op moves, and how p2p peers
are named) and from the real function's signature in the installed torch, so
the wrappers keep torch's parameter names and defaults exactly and follow them
across torch versions. The generated body is what a hand-written wrapper would
be, because this is the hot path (<= 2 us a call, measured by benches/hook_overhead).
The recorder's enter/complete are inlined here: two method calls and their attribute
lookups cost as much as the rest together on a Python of this speed. The names the body
uses are bound once into the wrapper's globals (``_inflight`` is ``REC.inflight``, ...):

    def all_reduce(tensor, op=<SUM>, group=None, async_op=False, log_name=None):
        if not REC.on or ("all_reduce" not in REC.ops and log_name not in REC.ops):
            return _real(tensor, op, group, async_op)
        span = cuda_start(tensor)
        g = _groups.get(group) or _group(group)
        t0 = perf_ns()
        rec = ["all_reduce", None, g, g.last() + g.offset, tensor.dtype, tensor.numel(), _state.step, t0, 0, t0,
               None, False, -1, None]   # recorder.new_record inlined
        key = id(rec)
        _inflight[key] = rec    # in flight from here
        try:
            work = _real(tensor, op, group, async_op)
        except BaseException:
            REC.abandon(rec)
            raise
        t1 = perf_ns()
        if async_op or span is not None or REC.debug or len(_pending) >= MAX_PENDING:
            return REC.complete(rec, log_name, work if async_op else None, span, t1)
        del _inflight[key]      # the common case, REC.complete's synchronous branch spelled out
        rec[1] = log_name or "all_reduce"   # SLOT_NAME
        rec[8] = t1                         # SLOT_T1
        _pending.append(rec)

The record is the list ``Recorder.enter`` builds (collector.rank.recorder's SLOT_* names its slots);
tests/unit/rank/test_liveness_config.py checks the inlined path against enter/complete row for row.

The real functions are called from ``torch.distributed.distributed_c10d``,
which ``collector.hook.attach`` never patches, so nothing is recorded twice.
``init_process_group`` / ``destroy_process_group`` here tell the recorder and
the session that the process groups changed (the hook patches them into
torch.distributed; the engine calls them through trainer.comm).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.distributed.distributed_c10d as c10d

from collector.rank import recorder as r
from collector.rank import session, state, watchdog  # noqa: F401  (watchdog: follows the session from here on)
from collector.rank.clock import perf_ns
from collector.rank.recorder import GROUP_SIZE, INSTRUMENTED_OPS, MAX_PENDING, REC, cuda_start


@dataclass(frozen=True)
class OpSpec:
    """How to record one op: expressions over the op's own parameter names."""

    name: str
    tensor: str | None  # the tensor whose dtype is recorded and whose device is timed (None: barrier)
    numel: str = "{tensor}.numel()"  # elements of one rank's part
    scale: str = "1"  # numel x scale = the op's data size S in elements (GROUP_SIZE: the group's size)
    skip_if: str = ""  # pass straight through when true (an empty tensor list)
    kind: str = "collective"  # or "send" / "recv" (sync p2p), "isend" / "irecv" (async p2p)
    peer: str = ""  # p2p: the global rank of the other side
    record_as: str = ""  # the op name in the comm table, when it is not the function's own

    @property
    def op(self) -> str:
        return self.record_as or self.name


_SUM_INPUTS = "sum(t.numel() for t in {})"
SPECS = {
    s.name: s
    for s in (
        OpSpec("all_reduce", "tensor"),
        OpSpec("all_reduce_coalesced", "tensors[0]", _SUM_INPUTS.format("tensors"), skip_if="not tensors"),
        OpSpec("all_gather", "tensor", scale="len(tensor_list)"),
        OpSpec("all_gather_into_tensor", "input_tensor", "output_tensor.numel()"),
        # torch 2.13's *_single spellings are the same ops as the long-standing names: rows keep
        # the long names, so queries and dashboards read the same across torch versions
        OpSpec("all_gather_single", "input_tensor", "output_tensor.numel()", record_as="all_gather_into_tensor"),
        OpSpec(
            "all_gather_coalesced",
            "input_tensor_list[0]",
            "sum(t.numel() for out in output_tensor_lists for t in out)",
            skip_if="not input_tensor_list",
        ),
        OpSpec("reduce_scatter", "output", _SUM_INPUTS.format("input_list")),
        OpSpec("reduce_scatter_tensor", "input"),
        OpSpec("reduce_scatter_single", "input", record_as="reduce_scatter_tensor"),
        OpSpec(
            "all_to_all",
            "input_tensor_list[0]",
            _SUM_INPUTS.format("input_tensor_list"),
            skip_if="not input_tensor_list",
        ),
        OpSpec("all_to_all_single", "input"),
        OpSpec("broadcast", "tensor"),
        OpSpec("reduce", "tensor"),
        OpSpec("gather", "tensor", scale="GROUP_SIZE"),
        OpSpec("scatter", "tensor", scale="GROUP_SIZE"),
        OpSpec("barrier", None, "0"),
        OpSpec("send", "tensor", kind="send", peer="global_peer(group, dst, group_dst)"),
        OpSpec("recv", "tensor", kind="recv"),
        OpSpec("isend", "tensor", kind="isend", peer="global_peer(group, dst, group_dst)"),
        OpSpec("irecv", "tensor", kind="irecv", peer="global_peer(group, src, group_src)"),
    )
}


def global_peer(group, peer, group_peer) -> int:
    """The other side's global rank from a p2p call's ``dst``/``src`` or ``group_dst``/``group_src``."""
    if peer is None and group_peer is not None:
        return c10d.get_global_rank(group, group_peer) if group is not None else group_peer
    return -1 if peer is None else peer


def _source(spec: OpSpec, real) -> tuple[str, dict]:
    """The wrapper's source text and the defaults it refers to."""
    params, call, defaults = [], [], {}
    for p in inspect.signature(real).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"torch.distributed.{spec.name} takes *args/**kwargs; it needs a hand-written wrapper")
        if p.default is p.empty:
            params.append(p.name)
        else:
            defaults[f"_default_{p.name}"] = p.default
            params.append(f"{p.name}=_default_{p.name}")
        call.append(f"{p.name}={p.name}" if p.kind is p.KEYWORD_ONLY else p.name)
    if any(p.kind is p.KEYWORD_ONLY for p in inspect.signature(real).parameters.values()):
        first_kw = next(
            i for i, p in enumerate(inspect.signature(real).parameters.values()) if p.kind is p.KEYWORD_ONLY
        )
        params.insert(first_kw, "*")
    args = ", ".join(call)
    tensor = spec.tensor
    numel = spec.numel.format(tensor=tensor)
    dtype = f"{tensor}.dtype" if tensor else "torch.uint8"
    # Without CUDA no tensor can be on a device: leave the per-call device check out entirely.
    span = f"cuda_start({tensor})" if tensor and torch.cuda.is_available() else "None"
    skip = f" or {spec.skip_if}" if spec.skip_if else ""
    passthrough = (
        f"        return _real({args})\n"
        if spec.kind == "collective"  # gloo's collective counter counts p2p too, recorded or not:
        else f"        out = _real({args})\n        REC.count_p2p(group)\n        return out\n"
    )
    head = (
        f"def {spec.name}({', '.join(params)}, log_name=None):\n"
        f"    if not REC.on or ({spec.op!r} not in REC.ops and log_name not in REC.ops){skip}:\n" + passthrough
    )
    if spec.kind == "collective":
        # The in-flight mark, Recorder.enter inlined: the record is in ``inflight`` (group, seq, size,
        # time) before the call, so a collective that never returns is still known; cleared if the
        # call raises (zero-cost try). One clock read per edge; the entry time is also the wait start.
        size = (
            numel
            if spec.scale == "1"
            else f"({numel}) * g.size"
            if spec.scale == "GROUP_SIZE"
            else f"({numel}) * ({spec.scale})"
        )
        # recorder.new_record, inlined: each slot's expression under its name
        slots = {r.SLOT_OP: repr(spec.op), r.SLOT_NAME: "None", r.SLOT_GROUP: "g", r.SLOT_SEQ: "g.last() + g.offset"}
        slots.update({r.SLOT_DTYPE: dtype, r.SLOT_NUMEL: size, r.SLOT_STEP: "_state.step", r.SLOT_T0: "t0"})
        slots.update({r.SLOT_T1: "0", r.SLOT_SINCE: "t0", r.SLOT_TIMING: "None", r.SLOT_ASYNC: "False"})
        slots.update({r.SLOT_PEER: "-1", r.SLOT_KEY: "None"})
        record = ", ".join(slots[i] for i in range(len(slots)))
        slow = "async_op" + (" or span is not None" if span != "None" else "") + " or REC.debug"
        body = (
            f"    span = {span}\n"
            f"    g = _groups.get(group) or _group(group)\n"
            f"    t0 = perf_ns()\n"
            f"    rec = [{record}]\n"
            f"    key = id(rec)\n"
            f"    _inflight[key] = rec\n"
            f"    try:\n        work = _real({args})\n"
            f"    except BaseException:\n        REC.abandon(rec)\n        raise\n"
            f"    t1 = perf_ns()\n"
            f"    if {slow} or len(_pending) >= MAX_PENDING:\n"
            f"        return REC.complete(rec, log_name, work if async_op else None, span, t1)\n"
            f"    del _inflight[key]\n"
            f"    rec[{r.SLOT_NAME}] = log_name or {spec.op!r}\n"
            f"    rec[{r.SLOT_T1}] = t1\n"
            f"    _pending.append(rec)\n"
        )
        return head + body, defaults
    facts = f"{dtype}, {spec.numel.format(tensor=tensor)} * {spec.scale}"
    if spec.kind == "send":
        body = (
            f"    span = {span}\n    t0 = perf_ns()\n    _real({args})\n    REC.count_p2p(group)\n"
            f"    REC.record({spec.op!r}, log_name, t0, None, span, {facts}, {spec.peer})\n"
        )
    elif spec.kind == "recv":
        body = (
            f"    span = {span}\n    t0 = perf_ns()\n    sender = _real({args})\n    REC.count_p2p(group)\n"
            f"    REC.record({spec.op!r}, log_name, t0, None, span, {facts}, sender, True)\n"
            f"    return sender\n"
        )
    else:  # isend / irecv: always async, no CUDA events (the future stamps the end)
        from_src = spec.kind == "irecv"
        body = (
            f"    t0 = perf_ns()\n    work = _real({args})\n    REC.count_p2p(group)\n    if work is not None:\n"
            f"        work = REC.record({spec.op!r}, log_name, t0, work, None, {facts}, {spec.peer}, "
            f"{from_src})\n    return work\n"
        )
    return head + body, defaults


def instrument(spec: OpSpec):
    """The instrumented wrapper of ``torch.distributed.<spec.name>``."""
    real = getattr(c10d, spec.name)
    text, defaults = _source(spec, real)
    namespace = {
        "REC": REC,
        # the recorder's containers are cleared, never rebound: the wrappers hold them directly
        "_inflight": REC.inflight,
        "_pending": REC.pending,
        "_groups": REC.groups,
        "_group": REC._group,
        "_state": state,
        "MAX_PENDING": MAX_PENDING,
        "perf_ns": perf_ns,
        "cuda_start": cuda_start,
        "torch": torch,
        "GROUP_SIZE": GROUP_SIZE,
        "global_peer": global_peer,
        "_real": real,
        **defaults,
    }
    exec(compile(text, f"<rankscope wrapper of {spec.name}>", "exec"), namespace)
    wrapper = namespace[spec.name]
    wrapper.__doc__ = f"``torch.distributed.{spec.name}``, recorded as a ``comm`` row (``log_name`` names it)."
    wrapper.__module__ = __name__
    wrapper.__wrapped_source__ = text  # what was generated, for readers and tests
    return wrapper


for _name in INSTRUMENTED_OPS:
    globals()[_name] = instrument(SPECS[_name])
del _name


@functools.wraps(c10d.init_process_group)
def init_process_group(*args, **kwargs):
    # torch.distributed.nn.functional binds group.WORLD into its functions' defaults when first
    # imported, and building the first torch optimizer imports it. Imported after this call, it
    # pins the world group and its gloo threads past destroy_process_group to interpreter exit,
    # where their teardown now and then aborts a finished rank ("terminate called without an
    # active exception"). Imported before, it binds None.
    import torch.distributed.nn.functional  # noqa: F401

    c10d.init_process_group(*args, **kwargs)
    REC.forget_groups()
    session.on_process_group()


@functools.wraps(c10d.destroy_process_group)
def destroy_process_group(group=None):
    c10d.destroy_process_group(group)
    REC.forget_groups()


batch_isend_irecv = c10d.batch_isend_irecv  # not instrumented: its ops are issued inside c10d
