"""Step analysis: per rank and step, exposed communication and straggler cost (the statement below)."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from collector.data import clocks
from collector.data.instances import instances_sql, join_condition
from collector.data.queries.connection import Catalog, in_memory
from collector.data.schema import STEP_ANALYSIS_SCHEMA

# A rank's step is the span of its step timers (first start to last end, on the collector's
# clock); only communication inside it counts, so start-up broadcasts and checkpoint traffic
# between steps never read as a straggler. Per rank and step the statement gives:
#   comm_ms       the union of the step's communication intervals (overlapping async
#                 collectives count once, so it never exceeds step_ms);
#   waiting_ms    the union of the parts spent before the instance's last rank arrived;
#   overlapped_ms the part of comm_ms that ran during the rank's compute timers (fwd, bwd_inner);
#   imposed_ms    the wait this rank imposed on the others by arriving last: per instance, the
#                 span from the second-latest arrival to its own (what the step would have saved
#                 had it come with the others), combined over the instances of the step it was
#                 last at as a union (concurrent async collectives hold the others once). Less
#                 the part of that span its own previous collective of the group (by seq: the one
#                 it issued before in that group) was still in flight, where that one had ended
#                 when it arrived (it may have held the rank; one still in flight at its arrival
#                 was async and left the rank free): a rank that leaves a
#                 collective last (in a ring the ranks finish at different times, and a slow link
#                 stretches that) arrives last at the next one through no compute of its own;
#                 the network, not the rank, held the others;
#                 Point-to-point instances never count: a receive waits for its producer's
#                 compute (a pipeline's bubble, collector.data.pipeline), not for a late peer;
#   late_op       the op where it imposed the longest wait;
#   held_ms       per step (the same on every rank's row), the union of every rank's imposed
#                 waits: step time less held_ms is the "what-if" step without late arrivals.
#   timed         whether the run has step timers; without them (a hook run that sends none) a
#                 step is the span of the rank's communication, enough for the straggler cost
#                 but not for shares of step time.
#
# One pass: the records are read once and grouped into instances once (the second-latest
# arrival comes out of that grouping). Every union is a sweep, not islands: sorted by start,
# an interval adds the part of it past the furthest end of the intervals before it, so one
# sort of a (rank, step) serves all its unions (comm, waiting, compute, comm + compute) as
# running maxima side by side, and the overlap with compute is |comm| + |compute| - |both|.
# It reads two relations: ``c`` (rank, step, group_name, seq, op, start_ns, end_ns) and ``t``
# (rank, step, name, start_ns, end_ns), so the same text runs on the catalog and on Arrow tables.

COMPUTE_TIMERS = ("fwd", "bwd_inner")


_FAR_PAST = "(-9223372036854775807)::BIGINT"


def _union_lengths(
    partition: str, source: str, sets: dict[str, tuple[str | None, str]], carry: tuple[str, ...] = ()
) -> str:
    """Per ``partition`` of ``source``, the union length (ns) of each named set of intervals,
    as columns ``<name>_ns``. A set is (condition on the row ``x`` or None for every row, the
    column that ends its intervals); all start at ``s``. The rows are sorted once by (s, e) into a
    list, which one list_reduce sweeps keeping a running furthest end per set (cheaper here than
    a window: a GROUP BY sorts each small list, not the whole relation). ``carry``: more columns
    of ``source`` to put in the list (ones the conditions read)."""
    fields, start = [], []
    for name, (cond, end) in sets.items():
        reach = f"a.{name}_reach"
        grow, piece = f"greatest({reach}, x.{end})", f"greatest(0, x.{end} - greatest(x.s, {reach}))"
        if cond:
            grow, piece = f"CASE WHEN {cond} THEN {grow} ELSE {reach} END", f"CASE WHEN {cond} THEN {piece} ELSE 0 END"
        fields += [f"'{name}_reach': {grow}", f"'{name}_ns': a.{name}_ns + {piece}"]
        start += [f"'{name}_reach': {_FAR_PAST}", f"'{name}_ns': 0::BIGINT"]
    columns = {"s", "e", *(end for _, end in sets.values()), *carry}
    row = ", ".join(f"'{c}': {c}" for c in sorted(columns))
    return f"""
        SELECT {partition}, unnest(list_reduce(list({{{row}}} ORDER BY s, e),
                                             lambda a, x: {{{", ".join(fields)}}}, {{{", ".join(start)}}}))
        FROM {source} GROUP BY {partition}"""


def _step_analysis_body(timed: bool) -> str:
    """The statement after ``WITH`` (``timed``: whether ``t`` has rows; it decides what a step is)."""
    span_of = "t" if timed else "c"
    compute = ", ".join(f"'{name}'" for name in COMPUTE_TIMERS)
    return f"""
    win AS (SELECT rank, step, min(start_ns) AS w0, max(end_ns) AS w1 FROM {span_of} GROUP BY rank, step),
    cp AS (SELECT *, max(end_ns) OVER (PARTITION BY rank, group_name ORDER BY seq
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end FROM c),
    cw AS MATERIALIZED (
        SELECT c.rank, c.step, c.group_name, c.seq, c.op, c.start_ns, c.prev_end,
               greatest(c.start_ns, w.w0) AS s, least(c.end_ns, w.w1) AS e
        FROM cp c JOIN win w ON c.rank = w.rank AND c.step = w.step
        WHERE c.end_ns > w.w0 AND c.start_ns < w.w1),
    inst AS MATERIALIZED ({
        instances_sql(
            "cw",
            runner_up=True,
            extra=("any_value(step) AS step", "any_value(op) AS op", "arg_max(prev_end, start_ns) AS last_prev_end"),
        )
    }),
    iv AS (
        SELECT cw.rank, cw.step, true AS is_comm, cw.s, cw.e,
               least(greatest(coalesce(i.last_ns, cw.s), cw.s), cw.e) AS wait_e
        FROM cw LEFT JOIN inst i ON {join_condition("cw", "i")}
        UNION ALL
        SELECT rank, step, false, start_ns, end_ns, NULL FROM t WHERE name IN ({compute})),
    unions AS ({
        _union_lengths(
            "rank, step",
            "iv",
            {
                "comm": ("x.is_comm", "e"),
                "wait": ("x.is_comm", "wait_e"),
                "compute": ("NOT x.is_comm", "e"),
                "any": (None, "e"),
            },
            carry=("is_comm",),
        )
    }),
    late AS MATERIALIZED (
        SELECT step, last_rank AS rank, op,
               CASE WHEN last_prev_end <= last_ns THEN greatest(runner_up_ns, last_prev_end)
                    ELSE runner_up_ns END AS s, last_ns AS e
        FROM inst WHERE n_ranks > 1 AND NOT starts_with(group_name, 'p2p[')),
    imposed AS ({_union_lengths("rank, step", "late", {"late": (None, "e")})}),
    late_op AS (SELECT rank, step, arg_max(op, e - s) AS op FROM late GROUP BY rank, step),
    held AS ({_union_lengths("step", "late", {"late": (None, "e")})})
    SELECT w.rank, w.step, (w.w1 - w.w0) / 1e6 AS step_ms,
           coalesce(u.comm_ns, 0) / 1e6 AS comm_ms, coalesce(u.wait_ns, 0) / 1e6 AS waiting_ms,
           coalesce(u.comm_ns + u.compute_ns - u.any_ns, 0) / 1e6 AS overlapped_ms,
           coalesce(im.late_ns, 0) / 1e6 AS imposed_ms, lo.op AS late_op, coalesce(h.late_ns, 0) / 1e6 AS held_ms,
           {str(timed).lower()} AS timed
    FROM win w
    LEFT JOIN unions u ON u.rank = w.rank AND u.step = w.step
    LEFT JOIN imposed im ON im.rank = w.rank AND im.step = w.step
    LEFT JOIN late_op lo ON lo.rank = w.rank AND lo.step = w.step
    LEFT JOIN held h ON h.step = w.step
    ORDER BY w.step, w.rank"""


# Timers are on the rank's own clock: moved by its Hello offset and by what clocks.fixes_sql
# found left over (``fix``, over the same steps' comm rows), as the comm rows ``c`` are.
_RUN_TIMERS = """
    offsets AS (SELECT rank, any_value(clock_offset_ns) AS off FROM ranks WHERE run_id = ? GROUP BY rank),
    t AS MATERIALIZED (
        SELECT tm.rank, tm.step, tm.name, tm.start_ns - coalesce(o.off, 0) - coalesce(f.fix_ns, 0) AS start_ns,
               tm.start_ns + tm.dur_ns - coalesce(o.off, 0) - coalesce(f.fix_ns, 0) AS end_ns
        FROM timers tm LEFT JOIN offsets o ON o.rank = tm.rank LEFT JOIN fix f ON f.rank = tm.rank
        WHERE tm.run_id = ? AND tm.step > ? AND tm.step <= ? AND tm.start_ns IS NOT NULL AND tm.dur_ns IS NOT NULL)"""


def step_analysis(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Per rank and step of a run: step_ms, comm_ms, waiting_ms, overlapped_ms, imposed_ms, late_op,
    held_ms, timed (see above). The steps the collector already analysed as they settled (the
    ``step_analysis`` table, written by compaction) are read back; only the steps after the last of
    them are computed from the raw records, so the cost follows the unsettled tail, not the run."""
    if not cat.has_rows("step_analysis", run_id):  # nothing settled yet (a short or young run)
        return analyse_steps(cat, run_id)
    stored = cat.df(
        f"SELECT {_STEP_ANALYSIS_COLUMNS} FROM step_analysis WHERE run_id = ? ORDER BY step, rank", [run_id]
    )
    if stored.empty:
        return analyse_steps(cat, run_id)
    fresh = analyse_steps(cat, run_id, after=int(stored.step.max()))
    return stored if fresh.empty else pd.concat([stored, fresh], ignore_index=True)


_STEP_ANALYSIS_COLUMNS = ", ".join(f'"{f.name}"' for f in STEP_ANALYSIS_SCHEMA)
_LAST_STEP = 2**62


def analyse_steps(cat: Catalog, run_id: str, after: int = -1, through: int | None = None) -> pd.DataFrame:
    """``step_analysis`` computed from the raw records of the steps in (``after``, ``through``]
    (``through`` None: every later step). Timers are moved onto the collector's clock with the
    rank's measured offset, as the comm records already are; a rank whose clock is still off
    beyond clocks.BOUND_NS (measured over these steps) has both moved by what is left."""
    timed = cat.has_rows("timers", run_id) and bool(
        cat.df(
            "SELECT EXISTS (SELECT 1 FROM timers WHERE run_id = ? AND start_ns IS NOT NULL AND dur_ns IS NOT NULL)"
            " AS yes",
            [run_id],
        ).yes.iloc[0]
    )
    # The records are read twice (for the clock check, and for the step spans without timers):
    # read them once into memory.
    steps = [after, _LAST_STEP if through is None else through]
    return cat.df(
        f"""
        WITH raw AS MATERIALIZED (SELECT rank, step, group_name, seq, op, start_ns, end_ns FROM comm
                                  WHERE run_id = ? AND step > ? AND step <= ?),
        fix AS MATERIALIZED ({clocks.fixes_sql("raw")}),
        c AS ({clocks.fixed_sql("raw", "fix")}),
        {_RUN_TIMERS},
        {_step_analysis_body(timed)}""",
        [run_id, *steps, run_id, run_id, *steps],
    )


def step_analysis_of(comm: pa.Table, timers: pa.Table) -> pd.DataFrame:
    """``step_analysis`` over in-memory tables: ``comm`` (rank, step, group_name, seq, op, start_ns,
    end_ns) and ``timers`` (rank, step, name, start_ns, end_ns), already on one clock."""
    return in_memory(f"WITH {_step_analysis_body(timers.num_rows > 0)}", [], c=comm, t=timers)
