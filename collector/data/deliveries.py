"""When each batch of a rank's telemetry reached the collector, against when it was made.

One row per *flush* of a rank's client (collector.server.service): the first table envelope that
arrives more than FLUSH_GAP_NS after that stream's previous one stands for the flush (a client
sends all it holds at once, every 0.2 s: one row per rank per flush, not one per table). ``made_ns``, the
latest time among the envelope's records (``end_ns``, ``time_ns``, ``start_ns + dur_ns``: the
rank's clock, on rank 0's time line), and ``received_ns``, the collector's clock when it took the
envelope up. ``received_ns - made_ns`` is the envelope's delivery lag: the client's flush wait,
the network, and any clock difference between rank 0 and the collector.

What it is for: a rank's telemetry leaves through its host's network interface, so when that
interface is the slow link its telemetry queues behind the training traffic there, and that
host's delivery lag rises while other hosts' does not (collector.data.findings.link_side). The
constant parts (a clock offset, the route to the collector) cancel in a rise.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from collector.data.schema import DELIVERIES_SCHEMA

FLUSH_GAP_NS = 50_000_000  # envelopes of one flush arrive within a few ms; flushes are 200 ms apart


def made_ns(rows: pa.Table) -> int | None:
    """The latest record time in ``rows`` (one envelope's decoded batch); None without times."""
    names = set(rows.column_names)
    latest = []
    for column in ("end_ns", "time_ns"):
        if column in names:
            latest.append(pc.max(rows[column]).as_py())
    if {"start_ns", "dur_ns"} <= names:
        latest.append(pc.max(pc.add(rows["start_ns"], rows["dur_ns"])).as_py())
    latest = [x for x in latest if x]
    return max(latest) if latest else None


def delivery_row(table: str, rank: int, rows: pa.Table, received_ns: int) -> pa.Table | None:
    """The deliveries row of one accepted envelope of ``table`` (None: its records carry no time)."""
    made = made_ns(rows)
    if made is None or rows.num_rows == 0:
        return None
    step = pc.max(rows["step"]).as_py() if "step" in rows.column_names else None
    return pa.table(
        {"rank": [rank], "step": [step], "table": [table], "made_ns": [made], "received_ns": [received_ns]},
        schema=DELIVERIES_SCHEMA,
    )
