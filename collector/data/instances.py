"""What one collective instance is, defined once for every query that needs it.

An instance is the set of ``comm`` rows, one per participating rank, that share
``(run_id, group_name, seq)``: ``seq`` counts collectives per group and is the
same on every rank of the group for the same call. For an instance:

- ``first_ns`` / ``last_ns``: the earliest and latest ``start_ns`` (entry time) of its ranks;
- ``last_rank``: the rank that entered last (the latest ``start_ns``; a tie goes to the
  lowest rank, so every query names the same rank);
- a rank's ``arrival_delay_ns`` = its ``start_ns - first_ns`` (how late it came) and its
  ``wait_ns`` = ``last_ns - start_ns`` (how long it waited for the last one);
- ``n_ranks``: how many ranks reported it;
- ``runner_up_ns`` (asked for with ``runner_up=True``): the second-latest ``start_ns``, so that
  ``last_ns - runner_up_ns`` is the wait the last rank imposed on the others (0 on a tie).

Rows without a group or seq (none today, but imported data may lack them) belong to no
instance. The catalog's views (``comm_instances``, ``stragglers``), the dashboard's
rollups and the health rules all build on ``instances_sql``.
"""

from __future__ import annotations

# start_ns is < 2^62; times 2^32 leaves room for any rank in a HUGEINT, and the key orders by
# start_ns first, then by lower rank: arg_max over it is "latest arrival, lowest rank on a tie"
# at the cost of a plain arg_max (a STRUCT key is ~5x slower on 10M rows).
LAST_RANK = "arg_max(rank, start_ns::HUGEINT * 4294967296 - rank)"
# max(x, 2) keeps the two largest: the second is the runner-up (NULL for an instance of one rank).
RUNNER_UP = "max(start_ns, 2)[2] AS runner_up_ns"


# Whether an instance's ranks entered it with different signatures: two known ops, dtypes or
# element counts that differ. A NULL field (a record that does not say: an imported dump, a
# framework that hides it) agrees with anything; min/max skip NULLs and cost two cheap aggregates.
SIGNATURES_DIFFER = "(min(op) <> max(op) OR min(dtype) <> max(dtype) OR min(numel) <> max(numel))"


def instances_sql(
    source: str,
    keys: tuple[str, ...] = ("group_name", "seq"),
    *,
    runner_up: bool = False,
    extra: tuple[str, ...] = (),
) -> str:
    """One row per instance of the comm rows in relation ``source`` (which must have
    ``rank``, ``start_ns`` and the ``keys`` columns): keys, first_ns, last_ns, last_rank, n_ranks,
    and runner_up_ns if asked. ``extra``: more aggregates over the instance's rows (``"any_value(op) AS op"``),
    computed in the same grouping."""
    cols = ", ".join(keys)
    not_null = " AND ".join(f"{k} IS NOT NULL" for k in keys)
    more = "".join(f", {e}" for e in ((RUNNER_UP,) if runner_up else ()) + tuple(extra))
    return f"""
        SELECT {cols}, min(start_ns) AS first_ns, max(start_ns) AS last_ns,
               {LAST_RANK} AS last_rank, count(*) AS n_ranks{more}
        FROM {source}
        WHERE {not_null} AND start_ns IS NOT NULL
        GROUP BY {cols}"""


def join_condition(left: str, right: str, keys: tuple[str, ...] = ("group_name", "seq")) -> str:
    """``left`` rows joined to their instance row in ``right``."""
    return " AND ".join(f"{left}.{k} = {right}.{k}" for k in keys)
