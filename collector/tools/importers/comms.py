"""What DeepSpeed's comms logger records mean in rankscope's ``comm`` columns.

Shared by the verbose-line and the summary importers.

- ``log_name`` is DeepSpeed's record name (with " | [Caller Func: f]" in debug mode);
  ``op`` is the torch.distributed function: the record name without the caller,
  or, for a custom log_name such as ``log_summary_barrier``, the longest known op
  name it contains.
- ``bytes`` is the nccl-tests data size S. DeepSpeed logs the size of the tensor
  argument: for all_gather / all_gather_into_tensor / gather / scatter that is one
  rank's piece, so S = msg size x world size; for every other op it already is S.
  DeepSpeed does not record the group, so ``group_size`` is the world size (as
  its own bandwidth formula assumes) and ``group_name`` / ``seq`` are unknown.
- ``algbw_gbs`` / ``busbw_gbs`` are recomputed from S and the latency with our
  definitions (collector/bandwidth.py), not copied from DeepSpeed's Gbps figures.
- rankscope's own comms logger (collector/comm.py) prints and returns sizes that
  already are S; its lines start with ``[rankscope]``.
"""

from __future__ import annotations

from collector.data import bandwidth

_PER_RANK_PIECE = {
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "_all_gather_base",
    "gather",
    "scatter",
}
_CALLER_SEP = " | [Caller Func:"


def op_name(record_name: str) -> str:
    base = record_name.split(_CALLER_SEP, 1)[0].strip()
    if base in bandwidth.OP_KINDS:
        return base
    known = [op for op in bandwidth.OP_KINDS if op in base]
    return max(known, key=len) if known else base


def comm_row(
    record_name: str,
    msg_size: int,
    latency_ms: float,
    world_size: int,
    *,
    deepspeed_sizes: bool,
    step: int | None = None,
    end_ns: int | None = None,
) -> dict:
    op = op_name(record_name)
    nbytes = msg_size * world_size if deepspeed_sizes and op in _PER_RANK_PIECE else msg_size
    dur_ns = round(latency_ms * 1e6)
    algbw, busbw = bandwidth.bandwidth(op, nbytes, dur_ns, max(world_size, 1))
    return dict(
        step=step,
        group_name=None,
        group_size=world_size,
        seq=None,
        op=op,
        log_name=record_name,
        dtype=None,
        numel=None,
        bytes=nbytes,
        start_ns=None if end_ns is None else end_ns - dur_ns,
        end_ns=end_ns,
        async_op=None,
        algbw_gbs=algbw,
        busbw_gbs=busbw,
        peer=None,
    )
