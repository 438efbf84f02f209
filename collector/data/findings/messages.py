"""Collectives whose transfer time goes mostly to small messages (latency-bound): one note for
the run, naming the ops and only the configuration keys that make their messages bigger in the
engine that produced the run.

Which keys those are depends on the engine (``runs.source`` and ``runs.config``):
the bundled engine buckets gradient reductions by ``reduce_bucket_size`` and ZeRO-3's
parameter gathers by ``stage3_prefetch_bucket_size``, and accepts ``allgather_bucket_size``
without acting on it (README, config keys); DeepSpeed honours all three. A plain
torch.distributed script has no such keys, so the note says what to do, not which key.

The note is about steady-state traffic, so it reads the training steps only
(queries.training_filter): the start-up parameter broadcast, one small message per tensor, done
once, is expected and no key makes it bigger.

On a pipeline run the point-to-point ops are left out: they carry one micro-batch's activations or
gradients between stages, sized by the micro-batch and the model, not by any bucket.
"""

from __future__ import annotations

import json

import pandas as pd

from collector.data.findings.model import Finding, pct

SMALL_MESSAGE_BYTES = 1 << 20
SMALL_MESSAGE_SHARE = 0.5
REDUCTIONS = {"all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce"}
GATHERS = {"all_gather", "all_gather_into_tensor", "all_gather_object"}
POINT_TO_POINT = {"send", "recv", "isend", "irecv"}

BUNDLED, DEEPSPEED, TORCH = "bundled engine", "DeepSpeed", "torch.distributed"


def has_point_to_point(log_summary: pd.DataFrame) -> bool:
    """Whether queries.log_summary holds point-to-point ops (a pipeline's stages exchange theirs)."""
    return not log_summary.empty and bool(log_summary.op.isin(POINT_TO_POINT).any())


def engine_of(source: str | None, config: str | None) -> tuple[str, int | None]:
    """Which engine produced a run, and its ZeRO stage where the config gives one."""
    try:
        cfg = json.loads(config) if config else {}
    except (TypeError, ValueError):
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    zero = cfg.get("zero_optimization")
    stage = zero.get("stage") if isinstance(zero, dict) else None
    stage = int(stage) if isinstance(stage, int | float) else None
    if source == "engine":
        return BUNDLED, stage
    if cfg and ("zero_optimization" in cfg or "train_micro_batch_size_per_gpu" in cfg or "train_batch_size" in cfg):
        return DEEPSPEED, stage
    return TORCH, stage


def bucket_key(op: str, engine: str, stage: int | None) -> str | None:
    """The dotted config key that makes ``op``'s messages bigger in ``engine``, if it has one."""
    if engine == TORCH:
        return None
    if op in REDUCTIONS:
        return "zero_optimization.reduce_bucket_size"
    if op in GATHERS:
        if stage == 3:
            return "zero_optimization.stage3_prefetch_bucket_size"
        return "zero_optimization.allgather_bucket_size" if engine == DEEPSPEED else None
    return None


def small_messages(
    log_summary: pd.DataFrame, engine: str = TORCH, stage: int | None = None, pipelined: bool = False
) -> list[Finding]:
    """From queries.log_summary (op, bytes, transfer_ms, ...); ``pipelined``: the run is a pipeline
    of two stages or more (its point-to-point ops left out)."""
    if pipelined and not log_summary.empty:
        log_summary = log_summary[~log_summary.op.isin(POINT_TO_POINT)]
    if log_summary.empty:
        return []
    small = log_summary.assign(small_ms=log_summary.transfer_ms.where(log_summary.bytes < SMALL_MESSAGE_BYTES, 0.0))
    per_op = small.groupby("op")[["transfer_ms", "small_ms"]].sum()
    per_op = per_op[per_op.transfer_ms > 0]
    if per_op.empty:
        return []
    bound = per_op[per_op.small_ms / per_op.transfer_ms >= SMALL_MESSAGE_SHARE]
    if bound.empty:
        return []
    ops = sorted(bound.index)
    share = bound.small_ms.sum() / bound.transfer_ms.sum()
    keys = sorted({k for op in ops if (k := bucket_key(op, engine, stage))})
    advice = f"raise {' and '.join(keys)}" if keys else "batch them into fewer, larger messages"
    return [
        Finding(
            kind="small_messages",
            severity="info",
            text=f"{pct(share)} of {', '.join(ops)} transfer time is in messages < 1 MB (latency-bound): {advice}",
            evidence={"ops": ops, "share": float(share), "engine": engine, "keys": keys},
            page="comms",
            filters={"op": ops},
        )
    ]
