"""Collective mismatches: the same ``(group_name, seq)`` entered with a different op, dtype
or element count on different ranks. Backends hang, fail or corrupt data on these; the
finding names both sides.

Input: queries.desyncs (group_name, seq, sides, n_sides), ``sides`` a list of
{op, dtype, numel, ranks}, the largest side first.

An unknown element count (numel NULL: None, or NaN in a frame pandas built; imported data may
not have it) is unknown, not a count of its own: it matches any count, so a side that differs
from the others by it alone is no mismatch, and the finding says "numel unknown".
"""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, ranks_label


def _numel(side) -> int | None:
    """The side's element count, None where it is unknown."""
    numel = side["numel"]
    return None if numel is None or pd.isna(numel) else int(numel)


def _side(side) -> str:
    numel = _numel(side)
    count = "x? (numel unknown)" if numel is None else f"x{numel}"
    return f"{side['op']} {side['dtype']} {count} on {ranks_label(side['ranks'])}"


def differing_fields(sides) -> list[str]:
    """The fields the sides disagree on; numel only where two known counts differ."""
    differs = [key for key in ("op", "dtype") if len({side[key] for side in sides}) > 1]
    if len({n for n in map(_numel, sides) if n is not None}) > 1:
        differs.append("numel")
    return differs


def _agree(a, b) -> bool:
    na, nb = _numel(a), _numel(b)
    return a["op"] == b["op"] and a["dtype"] == b["dtype"] and (na is None or nb is None or na == nb)


def mismatched_collectives(desyncs: pd.DataFrame) -> list[Finding]:
    found = []
    for row in desyncs.itertuples(index=False):
        sides = list(row.sides)
        differs = differing_fields(sides)
        if not differs:  # the sides differ by an unknown numel alone
            continue
        # the ranks that disagree with the largest side; where every side agrees with it (its numel is
        # the unknown one), the others, as before
        odd_sides = [side for side in sides[1:] if not _agree(side, sides[0])] or sides[1:]
        odd = sorted({int(r) for side in odd_sides for r in side["ranks"]})
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
                            "numel": _numel(s),
                            "ranks": [int(r) for r in s["ranks"]],
                        }
                        for s in sides
                    ],
                },
                page="liveness",
            )
        )
    return found
