"""The tables rankscope stores, their columns and types: one registry that the
client encoder, the collector's validator, the Parquet writer and the DuckDB
views all read, so a column is declared exactly once.

Every per-rank table also has ``run_id`` (the Hive partition ``run=``) and
``rank``; those come from the batch header, not from the columns listed here.
Add columns freely (at the end, nullable); never rename one: dashboards, user
SQL and archived runs depend on the names.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import pyarrow as pa

I64, F64, BOOL, STR = "i64", "f64", "boolean", "str"

ARROW_TYPES = {I64: pa.int64(), F64: pa.float64(), BOOL: pa.bool_(), STR: pa.string()}


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, wire type), after run_id/rank

    @functools.cached_property  # asked per row by importers' bounds checks and per batch by the codec
    def column_types(self) -> dict[str, str]:
        return dict(self.columns)

    @functools.cache  # noqa: B019 - tables are module-level constants; asked per decoded batch
    def arrow_schema(self) -> pa.Schema:
        """Schema of the stored Parquet files (run_id lives in the path)."""
        fields = [pa.field("rank", pa.int64())]
        fields += [pa.field(n, ARROW_TYPES[t]) for n, t in self.columns]
        return pa.schema(fields)


def _table(name: str, *cols: tuple[str, str]) -> Table:
    return Table(name, (("step", I64), *cols))


TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        _table(
            "comm",
            ("group_name", STR),
            ("group_size", I64),
            ("seq", I64),
            ("op", STR),
            ("log_name", STR),
            ("dtype", STR),
            ("numel", I64),
            ("bytes", I64),
            ("start_ns", I64),
            ("end_ns", I64),
            ("async_op", BOOL),
            ("algbw_gbs", F64),
            ("busbw_gbs", F64),
            ("peer", I64),
        ),
        _table("timers", ("name", STR), ("start_ns", I64), ("dur_ns", I64)),
        _table("monitor", ("tag", STR), ("value", F64), ("samples", I64), ("time_ns", I64)),
        _table(
            "loss_scale",
            ("scale_before", F64),
            ("scale", F64),
            ("overflow", BOOL),
            ("hysteresis_left", I64),
            ("bad_params", STR),
            ("first_rank", I64),
            ("time_ns", I64),
        ),
        _table(
            "flops",
            ("module", STR),
            ("parent", STR),
            ("depth", I64),
            ("module_type", STR),
            ("params", I64),
            ("macs", I64),
            ("flops", I64),
            ("latency_ns", I64),
            ("bwd_latency_ns", I64),
        ),
        _table("memory", ("kind", STR), ("bytes", I64), ("time_ns", I64)),
        _table(
            "moe",
            ("layer", I64),
            ("expert", I64),
            ("tokens", I64),
            ("dropped", I64),
            ("capacity", I64),
            ("aux_loss", F64),
        ),
        # Root-cause signals (collector.rank.signals): Python GC pauses per step and generation ...
        _table(
            "gc",
            ("generation", I64),
            ("count", I64),
            ("dur_ns", I64),
            ("max_ns", I64),
            ("collected", I64),
        ),
        # ... and the host and process as the rank's background thread samples them: host CPU
        # busy and steal shares over the interval, the time this process waited for a CPU
        # (run queue) and ran on one, and its resident memory.
        _table(
            "host",
            ("time_ns", I64),
            ("interval_ns", I64),
            ("cpu_util", F64),
            ("steal", F64),
            ("runqueue_ns", I64),
            ("cpu_ns", I64),
            ("rss_bytes", I64),
            ("mem_available_bytes", I64),  # the host's MemAvailable: how far an OOM is
            # the host's system clock minus the run's time line (its monotonic clock) since the rank
            # started: a jump between samples is a clock step (findings.clock)
            ("wall_drift_ns", I64),
        ),
        # ... and what the rank trained on in the step (trainer.batches): samples, and tokens where
        # the inputs are token ids (NULL otherwise). Input imbalance shows here.
        _table("batches", ("samples", I64), ("tokens", I64)),
        # ... and, in hook runs (collector.rank.between_steps), the wait from the end of the step
        # before to this step's first forward pass: data loading and host work between steps.
        _table("between_steps", ("start_ns", I64), ("dur_ns", I64)),
        # Pipeline parallelism (collector.rank.pipe_timeline): what a stage did in a step and when -- kind
        # fwd / bwd per micro-batch, recv_act / recv_grad (waiting for the neighbour stage),
        # send_wait and reduce (micro_batch -1) -- on rank 0's clock; collector.data.pipeline
        # turns them into bubbles.
        _table(
            "pipe",
            ("stage", I64),
            ("stages", I64),
            ("data_rank", I64),  # which pipeline (data-parallel replica) the stage belongs to
            ("micro_batches", I64),
            ("virtual_stages", I64),  # model chunks a stage holds (interleaved 1F1B); NULL: one
            ("layers", I64),  # layers on this stage
            ("kind", STR),
            ("micro_batch", I64),
            ("start_ns", I64),
            ("end_ns", I64),
        ),
        # Liveness (collector.rank.watchdog): what a rank is waiting in, its sign of life, its stacks.
        _table(
            "inflight",
            ("group_name", STR),
            ("group_size", I64),
            ("group_ranks", STR),  # members as a range label ("0-3,8"): who should arrive
            ("seq", I64),
            ("op", STR),
            ("dtype", STR),
            ("numel", I64),
            ("bytes", I64),
            ("entered_ns", I64),  # when the rank began waiting (async ops whose end only wait() sees: the wait)
            ("time_ns", I64),  # when this report was made; waiting = time_ns - entered_ns
            ("hang_after_s", F64),
            ("state", STR),  # "waiting": still in flight; "failed": the call raised (a timeout, a peer gone)
        ),
        _table(
            "heartbeats",
            ("time_ns", I64),
            ("period_s", F64),
            ("inflight", I64),  # collectives in flight at this beat
            ("hang_after_s", F64),
            ("ending", BOOL),  # the last beat: the rank's session is stopping, its RunEnd follows
        ),
        _table(
            "stacks",
            ("reason", STR),
            ("thread_name", STR),
            ("thread_id", I64),
            ("is_main", BOOL),
            ("stack", STR),
            ("innermost", STR),  # "file:line in function" of the innermost frame
            ("time_ns", I64),
        ),
        # Evidence a rank captured when asked (collector.rank.capture, collector.server.artifacts): one
        # row per answer, accepted / refused / failed from the rank, captured from the collector once
        # it stored the trace (path relative to the data dir). ``step`` is the first step captured.
        _table(
            "artifacts",
            ("request_id", STR),
            ("kind", STR),  # profile | stacks | memory
            ("status", STR),  # accepted | refused | captured | failed
            ("steps", I64),  # asked for
            ("last_step", I64),
            ("path", STR),
            ("bytes", I64),
            ("reason", STR),
            ("finding", STR),
            ("role", STR),  # suspect | reference | asked
            ("detail", STR),
            ("time_ns", I64),
        ),
        # A link probe (collector.server.probe, collector.rank.probe): ``listening`` (the rank's listener
        # is open at ``port``), then per peer timed ``measured`` rows, one each way: ``send`` is this
        # rank's host to the peer's, ``receive`` the other way; ``failed`` says why not. A transfer
        # cut at its bound is measured over the bytes it moved (``bytes`` then less than asked).
        _table(
            "probes",
            ("request_id", STR),
            ("status", STR),  # listening | measured | failed | refused
            ("host", STR),
            ("peer_rank", I64),  # -1: the collector
            ("peer_host", STR),
            ("direction", STR),  # send | receive
            ("bytes", I64),
            ("seconds", F64),
            ("mbit_s", F64),
            ("port", I64),
            ("detail", STR),
            ("time_ns", I64),
        ),
    )
}

# Wall-clock columns are microseconds since the epoch, UTC: Parquet's TIMESTAMP(NANOS) is refused by
# Spark, Hive and Trino. Data dirs written before stored nanoseconds; readers that scan old and new
# segments as one dataset declare them as LEGACY_TIMESTAMP (which holds either unit without loss), and
# whatever writes a segment again (compaction, export, sample runs) narrows them with ``as_stored``.
TIMESTAMP = pa.timestamp("us", tz="UTC")
LEGACY_TIMESTAMP = pa.timestamp("ns", tz="UTC")


def timestamp(ns: int) -> pa.Array:
    """One wall-clock time given in ns, as the stored (microsecond) column holds it."""
    return pa.array([ns // 1000], TIMESTAMP)


def reading_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its timestamps as LEGACY_TIMESTAMP: what reads a stored segment of any age."""
    return pa.schema([f.with_type(LEGACY_TIMESTAMP) if f.type == TIMESTAMP else f for f in schema], schema.metadata)


def as_stored(table: pa.Table) -> pa.Table:
    """``table`` (read through ``reading_schema`` or from an older segment) with every nanosecond
    timestamp column truncated to the stored microseconds; the other columns as they are."""
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type) and field.type.unit == "ns":
            narrowed = table.column(i).cast(TIMESTAMP, safe=False)  # dropping sub-µs digits is the point
            table = table.set_column(i, field.with_type(TIMESTAMP), narrowed)
    return table


# Tables the collector writes itself from Hello / RunEnd messages.
RUNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("name", pa.string()),
        ("world_size", pa.int64()),
        ("started_at", TIMESTAMP),
        ("source", pa.string()),
        ("linked_run_id", pa.string()),
        ("config", pa.string()),
    ]
)
RANKS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int64()),
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("clock_offset_ns", pa.int64()),
        ("client_id", pa.string()),
        ("started_at", TIMESTAMP),
    ]
)
# What the collector saw of a rank's connection (collector.server.liveness): a stream that
# ended without RunEnd ("disconnected"), a stack request the rank did not answer ("unresponsive").
RANK_EVENTS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int64()),
        ("event", pa.string()),
        ("time", TIMESTAMP),
        ("detail", pa.string()),
    ]
)
RANK_ENDS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int64()),
        ("status", pa.string()),
        ("ended_at", TIMESTAMP),
        ("dropped_records", pa.int64()),
        # rank: the rank's own RunEnd; supervisor: recorded for it by whoever stopped the run
        # (collector.tools.supervise); NULL in segments written before the column
        ("ended_by", pa.string()),
    ]
)

# Per table envelope the collector accepted: when its latest record was made (rank 0's time line)
# and when the collector received it (its own clock); collector.data.deliveries. run_id is the
# partition, as for the per-rank tables.
DELIVERIES_SCHEMA = pa.schema(
    [
        ("rank", pa.int64()),
        ("step", pa.int64()),
        ("table", pa.string()),
        ("made_ns", pa.int64()),
        ("received_ns", pa.int64()),
    ]
)

# Per (rank, step, group, op, message size) sums of a run's comm records, written by the
# collector's retention pass (collector/server/compaction.py) before raw rows of a step go;
# the same columns as the dashboard's comm rollup (collector/data/queries/rollup.py), so pages read
# either. run_id is the partition, as for the per-rank tables.
COMM_STEPS_SCHEMA = pa.schema(
    [
        ("rank", pa.int64()),
        ("step", pa.int64()),
        ("group_name", pa.string()),
        ("op", pa.string()),
        ("bytes", pa.int64()),
        ("n", pa.int64()),
        ("dur_ns", pa.int64()),
        ("algbw_sum", pa.float64()),
        ("busbw_sum", pa.float64()),
        ("delay_sum_ns", pa.int64()),
        ("delay_max_ns", pa.int64()),
        ("wait_sum_ns", pa.int64()),
        ("n_last", pa.int64()),
        ("last_delay_sum_ns", pa.int64()),
    ]
)


# Per (rank, step) of a run: exposed communication and straggler cost (queries.step_analysis's
# columns), written by the collector's compaction once a step has settled (every rank moved past
# it), so a health summary or a page reads stored rows and computes only the steps after them.
STEP_ANALYSIS_SCHEMA = pa.schema(
    [
        ("rank", pa.int64()),
        ("step", pa.int64()),
        ("step_ms", pa.float64()),
        ("comm_ms", pa.float64()),
        ("waiting_ms", pa.float64()),
        ("overlapped_ms", pa.float64()),
        ("imposed_ms", pa.float64()),
        ("late_op", pa.string()),
        ("held_ms", pa.float64()),
        ("timed", pa.bool_()),
    ]
)


# The completed collective rows of the instances compaction could not settle within a window of
# steps: entered with more than one (op, dtype, numel), or by fewer ranks than the group has (the
# rest may come in a later window). Every other instance is whole and agrees, so the desync check
# reads these plus the raw rows after the last analysed step, not every record.
UNSETTLED_INSTANCES_SCHEMA = pa.schema(
    [
        ("rank", pa.int64()),
        ("step", pa.int64()),
        ("group_name", pa.string()),
        ("seq", pa.int64()),
        ("op", pa.string()),
        ("dtype", pa.string()),
        ("numel", pa.int64()),
    ]
)


_NO_ROLE = ("", "undefined", "default_pg", "p2p")  # torch's descriptions of no role; p2p[...] is ours


def group_name(desc, ranks_label: str) -> str:
    """A group's name in comm rows other than the world's: its role, the description a script gave
    it (``new_group(ranks, group_desc="tp")``, as the engine and Megatron do), and its ranks:
    ``tp[0-1]``; ``g[0-3,8]`` without a role."""
    role = "g" if not isinstance(desc, str) or desc in _NO_ROLE else re.sub(r"[^A-Za-z0-9_.-]", "_", desc)[:32]
    return f"{role}[{ranks_label}]"


def rank_ranges(ranks) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8': how a set of ranks is written in a column (``inflight.group_ranks``)
    and in sentences; stable, readable, short for big contiguous groups."""
    ranks = sorted(int(r) for r in ranks)
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(parts)
