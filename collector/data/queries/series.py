"""Per-step series a run recorded: step timers, monitor tags and losses, the loss scale, the flops
profile, memory and MoE routing (the Steps, Training, Memory and MoE pages)."""

from __future__ import annotations

import pandas as pd

from collector.data.queries.connection import Catalog


def step_breakdown(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Per rank and timer: mean duration per step (ms) -- a row per rank, not per rank-step."""
    return cat.df(
        """
        WITH per_step AS (SELECT rank, step, name, sum(dur_ns) AS dur_ns FROM timers WHERE run_id = ? GROUP BY ALL)
        SELECT rank, name, avg(dur_ns) / 1e6 AS dur_ms FROM per_step GROUP BY ALL ORDER BY rank, name""",
        [run_id],
    )


def step_wall_ms(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Per rank: total wall time of the timed steps (first timer start to last timer end)."""
    return cat.df(
        """
        WITH per_step AS (
            SELECT rank, step, max(start_ns + dur_ns) - min(start_ns) AS wall_ns
            FROM timers WHERE run_id = ? GROUP BY rank, step)
        SELECT rank, sum(wall_ns) / 1e6 AS wall_ms, count(*) AS steps FROM per_step GROUP BY rank ORDER BY rank""",
        [run_id],
    )


def monitor_series(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Every monitor tag per step (mean over ranks), with samples and time for throughput."""
    return cat.df(
        """
        SELECT tag, step, avg(value) AS value, max(samples) AS samples, max(time_ns) AS time_ns
        FROM monitor WHERE run_id = ? GROUP BY tag, step ORDER BY tag, step""",
        [run_id],
    )


def loss_series(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Every logged loss per step (tags naming a loss, not the loss scale): the mean of the finite
    values over ranks, and the ranks whose value was NaN or infinite (findings.loss)."""
    return cat.df(
        """
        SELECT tag, step, avg(value) FILTER (WHERE isfinite(value)) AS value,
               list(DISTINCT rank ORDER BY rank) FILTER (WHERE NOT isfinite(value)) AS bad_ranks
        FROM monitor WHERE run_id = ? AND lower(tag) LIKE '%loss%' AND lower(tag) NOT LIKE '%scale%'
        GROUP BY tag, step ORDER BY tag, step""",
        [run_id],
    )


def loss_scale(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Loss scale per step; a step overflowed if any rank said so."""
    return cat.df(
        """
        SELECT step, min(scale) AS scale, bool_or(overflow) AS overflow,
               any_value(bad_params) FILTER (WHERE overflow) AS bad_params
        FROM loss_scale WHERE run_id = ? GROUP BY step ORDER BY step""",
        [run_id],
    )


def flops_profile(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Every rank's module tree from the latest profiled step."""
    return cat.df(
        """
        SELECT rank, step, module, parent, depth, module_type, params, macs, flops, latency_ns, bwd_latency_ns
        FROM flops WHERE run_id = ?
        QUALIFY step = max(step) OVER ()
        ORDER BY rank, depth, module""",
        [run_id],
    )


def memory_lines(cat: Catalog, run_id: str, k: int) -> pd.DataFrame:
    """Per kind, the lines the Memory page draws (kind, step, series, bytes): every rank's while
    there are at most ``k``; beyond that the ``k`` ranks with the highest peak, and the median
    and max over all ranks at each step -- never a line per rank of a thousand."""
    return cat.df(
        """
        WITH m AS (SELECT rank, step, kind, max(bytes) AS bytes FROM memory WHERE run_id = ? GROUP BY ALL),
        n AS (SELECT kind, count(DISTINCT rank) AS ranks FROM m GROUP BY kind),
        top AS (
            SELECT kind, rank FROM (SELECT kind, rank, max(bytes) AS peak FROM m GROUP BY ALL)
            QUALIFY row_number() OVER (PARTITION BY kind ORDER BY peak DESC, rank) <= ?)
        SELECT m.kind, m.step, 'rank ' || m.rank AS series, m.bytes::DOUBLE AS bytes FROM m JOIN top USING (kind, rank)
        UNION ALL
        SELECT kind, step, 'median of ' || ranks || ' ranks', median(bytes)::DOUBLE
        FROM m JOIN n USING (kind) WHERE ranks > ? GROUP BY kind, step, ranks
        UNION ALL
        SELECT kind, step, 'max of ' || ranks || ' ranks', max(bytes)::DOUBLE
        FROM m JOIN n USING (kind) WHERE ranks > ? GROUP BY kind, step, ranks
        ORDER BY kind, series, step""",
        [run_id, int(k), int(k), int(k)],
    )


def moe_load(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Tokens routed to and dropped by each expert per step, summed over ranks."""
    return cat.df(
        """
        SELECT layer, expert, step, sum(tokens) AS tokens, sum(dropped) AS dropped, max(capacity) AS capacity
        FROM moe WHERE run_id = ? GROUP BY ALL ORDER BY layer, expert, step""",
        [run_id],
    )
