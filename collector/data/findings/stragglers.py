"""Ranks that arrive last at collectives far more often than chance would have them.

With n ranks, each instance has one last rank; on a healthy run that is anyone, about
1/n of the time each. At 1,024 ranks and a few hundred instances some rank is last three
or four times by pure chance, which is many times its fair share: a share threshold alone
cries wolf at scale. So a rank is named only when its count is both well above its share
(FAIR_SHARE_FACTOR) and beyond chance: the Chernoff bound on the binomial tail
P(X >= k), X ~ Bin(instances, 1/n), times n for looking at every rank, is below
CHANCE. The bound is an upper bound, so a healthy run stays silent.

The sentence names the few ranks that matter, the worst first ("ranks 17, 290 and 511
arrive last in 60% of all_reduces"), and counts the rest.
"""

from __future__ import annotations

import math

import pandas as pd

from collector.data.findings.model import Finding, duration, pct

FAIR_SHARE_FACTOR = 2.0
MIN_INSTANCES = 10
CHANCE = 1e-3  # how unlikely, over all ranks, a healthy run's worst count must be to name it
NAMED = 3  # ranks named in a sentence; more are counted


def chance_bound(k: int, instances: int, world_size: int) -> float:
    """Upper bound on the probability that any of ``world_size`` equally likely ranks is
    last in ``k`` or more of ``instances`` (Chernoff: exp(-N * KL(k/N || 1/n)), times n)."""
    p, q = 1 / world_size, k / instances
    if q <= p:
        return 1.0
    kl = q * math.log(q / p) + ((1 - q) * math.log((1 - q) / (1 - p)) if q < 1 else math.log(1 / (1 - p)))
    return min(1.0, world_size * math.exp(-instances * kl))


def rank_list(ranks: list[int], more: int = 0) -> str:
    """'rank 3', 'ranks 3 and 7', 'ranks 17, 290 and 511', 'ranks 17, 290, 511 and 4 more'."""
    words = [str(r) for r in ranks]
    if more:
        return f"ranks {', '.join(words)} and {more} more"
    if len(words) == 1:
        return f"rank {words[0]}"
    return f"ranks {', '.join(words[:-1])} and {words[-1]}"


def late_ranks(last_arrivals: pd.DataFrame, world_size: int) -> list[Finding]:
    """From queries.last_arrivals (op, rank, n_last, share, mean_lead_ms)."""
    found = []
    if world_size < 2:
        return found
    for op, rows in last_arrivals.groupby("op", sort=True):
        total = int(rows.n_last.sum())
        if total < MIN_INSTANCES:
            continue
        late = rows[
            (rows.share * world_size >= FAIR_SHARE_FACTOR)
            & rows.n_last.map(lambda k, n=total: chance_bound(int(k), n, world_size) < CHANCE)
        ].sort_values(["n_last", "rank"], ascending=[False, True])
        if late.empty:
            continue
        named = late.head(NAMED)
        ranks = [int(r) for r in named["rank"]]
        share = float(named.n_last.sum() / total)
        lead = float((named.mean_lead_ms * named.n_last).sum() / named.n_last.sum())
        verb = "arrives" if len(late) == 1 else "arrive"
        found.append(
            Finding(
                kind="straggler",
                severity="warning",
                ranks=tuple(ranks),
                text=f"{rank_list(ranks, len(late) - len(named))} {verb} last in {pct(share)} of {op}s "
                f"(+{duration(lead)} on average after the first rank)",
                evidence={
                    "op": op,
                    "share": share,
                    "instances": total,
                    "mean_lead_ms": lead,
                    "late_ranks": [int(r) for r in late["rank"]],
                },
                page="stragglers",
                filters={"op": op},
            )
        )
    return found
