"""Collective mismatches: the same ``(group_name, seq)`` entered with a different op, dtype
or element count on different ranks. Backends hang, fail or corrupt data on these; the
finding names both sides.

Input: queries.desyncs (group_name, seq, sides, n_sides), ``sides`` a list of
{op, dtype, numel, ranks}, the largest side first.
"""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, ranks_label


def _side(side) -> str:
    return f"{side['op']} {side['dtype']} x{side['numel']} on {ranks_label(side['ranks'])}"


def mismatched_collectives(desyncs: pd.DataFrame) -> list[Finding]:
    found = []
    for row in desyncs.itertuples(index=False):
        sides = list(row.sides)
        odd = sorted({int(r) for side in sides[1:] for r in side["ranks"]})
        differs = [key for key in ("op", "dtype", "numel") if len({side[key] for side in sides}) > 1]
        found.append(
            Finding(
                kind="desync",
                severity="critical",
                ranks=tuple(odd),
                text=f"collective mismatch at {row.group_name} #{row.seq} ({'/'.join(differs)} differ): "
                + " vs ".join(_side(side) for side in sides),
                evidence={
                    "group_name": row.group_name,
                    "seq": int(row.seq),
                    "differs": differs,
                    "sides": [
                        {
                            "op": s["op"],
                            "dtype": s["dtype"],
                            "numel": int(s["numel"]),
                            "ranks": [int(r) for r in s["ranks"]],
                        }
                        for s in sides
                    ],
                },
                page="liveness",
            )
        )
    return found
