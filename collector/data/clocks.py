"""Clock plausibility: what is left of a rank's clock offset after the one it measured at start.

Every rank's comm times reach the collector on rank 0's time line, moved by the offset the rank
measured at session start and sent in its Hello (``clock_offset_ns``; collector.rank.clock: a few
barrier + all_gather rounds across hosts, 0 for ranks on rank 0's host). That estimate can be
missing or wrong: ranks on different machines that report one host name, a session started
before the process group existed, an importer or a replay that had no offset. A rank 3 h off
then reads as 10,800 s late at every collective, and every other rank as waiting for it.

What is left over (the *residual*) is measured from when synchronising collectives **end**
(all_reduce, all_gather, reduce_scatter, all_to_all, barrier; not p2p, not rooted ops, whose root
may leave first): every rank leaves one together, whoever arrived late. Per instance, a rank's end
less the instance's median end is its clock's error plus noise; the median of that over the
rank's instances is robust to a stray descheduled rank; relative to rank 0's (the time line's
owner), so with two ranks the 3 h lands on the skewed one, not half on each.

Corrected, not left out: a rank left out of lateness judgments could be neither blamed nor cleared,
and its step timers (on the same wrong clock) would still not line up with anyone's. A late rank
still *ends* with the others, so correcting by end times keeps its real lateness (a 40 ms straggler
whose clock is 3 h behind is named for 40 ms: tests/unit/data/findings/test_clock.py). The correction
applies only beyond ``BOUND_NS``: on CUDA a collective's end is the CPU's enqueue time plus the GPU's
measured duration, so each rank's end is early by its GPU's lag behind its CPU, and that lag differs
between ranks (a CPU-bound straggler's GPU lags least) by up to about a step's queued work. Below the
bound the start-up estimate (one network latency of error) is the better one, and correcting by end
times there would cancel real stragglers on GPUs. Beyond it no lag explains the gap: the rank's clock
is off, and findings.clock says by how much (severity warning: times outside the comm analyses,
such as the timelines of samples, stay off).
"""

from __future__ import annotations

BOUND_NS = 2_000_000_000
MIN_INSTANCES = 3  # a residual rests on at least this many instances the rank ended with others
# ops every rank of the group leaves together (rooted ones, and monitored_barrier, whose rank 0
# waits for the others' replies, are not)
SYNC_OPS = (
    *("all_reduce", "all_reduce_coalesced", "inference_all_reduce"),
    *("all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_coalesced", "_all_gather_base"),
    *("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base"),
    *("all_to_all", "all_to_all_single", "barrier"),
)


def residuals_sql(source: str, by: tuple[str, ...] = ()) -> str:
    """Per rank (and ``by`` key, e.g. run_id) of relation ``source`` (rank, group_name, seq, op,
    end_ns and the ``by`` columns): ``residual_ns`` (its clock's error left over, relative to rank
    0's) and ``instances`` (how many synchronising instances it rests on). Ranks with fewer than
    MIN_INSTANCES get no row, and so does every rank of a ``by`` key none of whose instances
    ended more than BOUND_NS apart on its ranks: no residual can be beyond the bound there (it is
    a median, so at least half the rank's instances would spread that far), and the medians, the
    costly part, are skipped (a min and a max per instance cost far less)."""
    keys = "".join(f"{k}, " for k in by)
    part = f"PARTITION BY {', '.join(by)}" if by else ""
    ops = ", ".join(f"'{op}'" for op in SYNC_OPS)
    spread = f"SELECT {keys}true AS odd FROM inst WHERE hi - lo > {BOUND_NS} GROUP BY ALL"
    gate = f"SEMI JOIN ({spread}) USING ({keys[:-2]})" if by else f"WHERE EXISTS ({spread})"
    return f"""
        WITH ends AS (
            SELECT {keys}rank, group_name, seq, end_ns FROM {source}
            WHERE seq IS NOT NULL AND end_ns IS NOT NULL AND op IN ({ops}) AND NOT starts_with(group_name, 'p2p[')),
        inst AS (
            SELECT {keys}group_name, seq, min(end_ns) AS lo, max(end_ns) AS hi FROM ends GROUP BY ALL),
        suspect AS (SELECT * FROM ends {gate}),
        mids AS (
            SELECT {keys}group_name, seq, median(end_ns) AS mid FROM suspect GROUP BY ALL HAVING count(*) > 1),
        est AS (
            SELECT {keys}e.rank, median(e.end_ns - m.mid) AS est, count(*) AS instances
            FROM suspect e JOIN mids m USING ({keys}group_name, seq)
            GROUP BY ALL HAVING count(*) >= {MIN_INSTANCES})
        SELECT {keys}rank,
               (est - coalesce(any_value(est) FILTER (WHERE rank = 0) OVER ({part}), 0))::BIGINT AS residual_ns,
               instances
        FROM est"""


def fixes_sql(source: str, by: tuple[str, ...] = ()) -> str:
    """Per rank (and ``by`` key) of ``source`` whose residual is beyond BOUND_NS: ``fix_ns``, what
    to subtract from its times to put them on rank 0's time line."""
    keys = "".join(f"{k}, " for k in by)
    return f"""
        SELECT {keys}rank, residual_ns AS fix_ns FROM ({residuals_sql(source, by)})
        WHERE abs(residual_ns) > {BOUND_NS}"""


def fixed_sql(
    source: str, fixes: str, by: tuple[str, ...] = (), columns: tuple[str, ...] = ("start_ns", "end_ns")
) -> str:
    """The rows of ``source`` with ``columns`` moved by relation ``fixes`` (fixes_sql's rows)."""
    keys = ", ".join((*by, "rank"))
    moved = ", ".join(f"s.{c} - coalesce(f.fix_ns, 0) AS {c}" for c in columns)
    return f"SELECT s.* REPLACE ({moved}) FROM {source} s LEFT JOIN {fixes} f USING ({keys})"
