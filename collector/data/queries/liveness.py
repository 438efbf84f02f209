"""Liveness: hangs, collective mismatches, silent ranks, stacks and the wavefront (the catalog's
liveness views, collector.data.views.liveness_views; findings.{hang,desync,silent} judge them)."""

from __future__ import annotations

import pandas as pd

from collector.data import catalog, hang_rule
from collector.data.queries.connection import Catalog

HANG_COLUMNS = ["group_name", "seq", "op", "step", "waiting_ranks", "missing_ranks", "waiting_s", "hang_after_s"]


def hangs(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Collectives some ranks have waited in for at least hang_after_s, longest wait first."""
    # The view reads every comm record (how far each rank completed); a run no rank ever reported
    # a long enough wait for, the usual case, is answered from the small inflight table alone.
    # The same rule (collector.data.hang_rule) over every waiting report, a superset of the view's open ones.
    waited = (
        cat.has_rows("inflight", run_id)
        and cat.df(
            f"""SELECT EXISTS (
                SELECT 1 FROM (SELECT group_name, seq, (time_ns - entered_ns) / 1e9 AS waiting_s, hang_after_s
                               FROM inflight WHERE run_id = ? AND coalesce(state, 'waiting') = 'waiting')
                GROUP BY group_name, seq HAVING {hang_rule.HUNG_SQL}) AS yes""",
            [run_id],
        ).yes.iloc[0]
    )
    if not waited:
        return pd.DataFrame(columns=[*HANG_COLUMNS, "missing"])
    return cat.df(
        f"""SELECT {", ".join(HANG_COLUMNS)}, missing
           FROM hangs WHERE run_id = ? ORDER BY waiting_s DESC, group_name, seq""",
        [run_id],
    )


def desyncs(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Collective instances entered with different op/dtype/numel on different ranks (the ``desyncs``
    view's rows). Of the steps compaction analysed, only the instances it could not settle are read
    (the ``unsettled_instances`` table); the raw records after them as they are."""
    through = -1
    if cat.has_rows("step_analysis", run_id):
        through = cat.df("SELECT coalesce(max(step), -1) AS s FROM step_analysis WHERE run_id = ?", [run_id]).s.iloc[0]
    completed = """
        SELECT ?::VARCHAR AS run_id, rank, group_name, seq, op, dtype, numel FROM unsettled_instances WHERE run_id = ?
        UNION ALL
        SELECT run_id, rank, group_name, seq, op, dtype, numel FROM comm
        WHERE run_id = ? AND (step IS NULL OR step > ?) AND seq IS NOT NULL AND NOT starts_with(group_name, 'p2p[')"""
    return cat.df(
        f"""SELECT group_name, seq, sides, n_sides FROM ({catalog.desyncs_sql(completed)})
            WHERE run_id = ? ORDER BY group_name, seq""",
        [run_id, run_id, run_id, int(through), run_id],
    )


def rank_liveness(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Each rank's last heartbeat and how it ended (or did not), one row per rank that beat."""
    return cat.df(
        """SELECT rank, step, period_s, last_beat_ns, silent_s, behind_s, ended, gone, gone_ns, unresponsive,
                  run_status
           FROM rank_liveness WHERE run_id = ? ORDER BY rank""",
        [run_id],
    )


def stacks(cat: Catalog, run_id: str, ranks: list[int] | None = None) -> pd.DataFrame:
    """The latest stack capture of each rank (every thread of it), main thread first."""
    return cat.df(
        """WITH latest AS (
               SELECT rank, max(time_ns) AS time_ns FROM stacks WHERE run_id = ? GROUP BY rank)
           SELECT s.rank, s.step, s.reason, s.thread_name, s.is_main, s.innermost, s.stack, s.time_ns
           FROM stacks s JOIN latest l USING (rank, time_ns)
           WHERE s.run_id = ? AND (? IS NULL OR list_contains(?, s.rank))
           ORDER BY s.rank, s.is_main DESC, s.thread_name""",
        [run_id, run_id, ranks, ranks],
    )


WAVEFRONT_MAX_ROWS = 300  # rows of the wavefront chart; larger worlds are binned into rank ranges


def wavefront(cat: Catalog, run_id: str, max_rows: int = WAVEFRONT_MAX_ROWS) -> pd.DataFrame:
    """Per rank range and group: the lowest and highest last seq entered and completed (one rank
    per range when the world fits in ``max_rows`` rows, else ranges of equal width)."""
    return cat.df(
        """WITH w AS (SELECT * FROM wavefront WHERE run_id = ?),
           sized AS (
               SELECT greatest(1, CAST(ceil((SELECT max(rank) + 1 FROM w)
                      / greatest(1, ? // greatest(1, (SELECT count(DISTINCT group_name) FROM w)))) AS BIGINT))
                      AS width)
           SELECT (rank // width) * width AS rank_lo, min(rank) AS first_rank, max(rank) AS last_rank, group_name,
                  min(last_entered_seq) AS min_entered, max(last_entered_seq) AS max_entered,
                  min(last_completed_seq) AS min_completed, max(last_completed_seq) AS max_completed,
                  count(*) AS ranks
           FROM w, sized GROUP BY rank_lo, width, group_name ORDER BY group_name, rank_lo""",
        [run_id, max_rows],
    )
