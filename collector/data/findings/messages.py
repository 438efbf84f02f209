"""Collectives whose transfer time goes mostly to small messages (latency-bound)."""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, pct

SMALL_MESSAGE_BYTES = 1 << 20
SMALL_MESSAGE_SHARE = 0.5
# Which DeepSpeed knob makes an op's messages bigger.
BUCKET_KNOB = {
    "all_reduce": "reduce_bucket_size",
    "reduce_scatter": "reduce_bucket_size",
    "reduce_scatter_tensor": "reduce_bucket_size",
    "all_gather": "allgather_bucket_size",
    "all_gather_into_tensor": "allgather_bucket_size",
}


def small_messages(log_summary: pd.DataFrame) -> list[Finding]:
    """From queries.log_summary (op, bytes, transfer_ms, ...)."""
    found = []
    for op, rows in log_summary.groupby("op", sort=True):
        total = rows.transfer_ms.sum()
        if total <= 0:
            continue
        share = rows.loc[rows.bytes < SMALL_MESSAGE_BYTES, "transfer_ms"].sum() / total
        if share >= SMALL_MESSAGE_SHARE:
            knob = BUCKET_KNOB.get(op)
            advice = f": raise {knob}" if knob else ": batch them into larger messages"
            found.append(
                Finding(
                    kind="small_messages",
                    severity="warning",
                    text=f"{pct(share)} of {op} time is in messages < 1 MB{advice}",
                    evidence={"op": op, "share": float(share)},
                    page="comms",
                    filters={"op": op},
                )
            )
    return found
