"""Hangs: collectives that ranks have entered and still wait in after ``hang_after_s``.

Input: queries.hangs (one row per stuck instance: group_name, seq, op, step,
waiting_ranks, missing_ranks, waiting_s, hang_after_s, missing, where ``missing``
lists each missing rank's last entered / completed seq in that group). The
sentence names who waits, who never arrived and where the missing ranks were
last seen, which is what a person needs to go and look (their stacks are on
the Liveness section of the dashboard).
"""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, ranks_label

MAX_NAMED = 4  # missing ranks whose last collective the sentence spells out


def _where(missing) -> str:
    seen = []
    for m in list(missing)[:MAX_NAMED]:
        entered, completed = int(m["last_entered_seq"]), int(m["last_completed_seq"])
        if entered > completed:
            seen.append(f"rank {m['rank']} is inside #{entered}")
        elif completed:
            seen.append(f"rank {m['rank']} last completed #{completed}")
        else:
            seen.append(f"rank {m['rank']} has completed none")
    more = len(missing) - len(seen)
    return "; ".join(seen) + (f"; and {more} more" if more > 0 else "")


def stuck_collectives(hangs: pd.DataFrame) -> list[Finding]:
    found = []
    for row in hangs.itertuples(index=False):
        waiting = [int(r) for r in row.waiting_ranks]
        missing_ranks = [int(r) for r in row.missing_ranks]
        if missing_ranks:
            who = f"waiting for {ranks_label(missing_ranks)} ({_where(row.missing)})"
        else:
            who = "every member has entered it (a backend or network stall)"
        step = None if pd.isna(row.step) else int(row.step)
        found.append(
            Finding(
                kind="hang",
                severity="critical",
                ranks=tuple(missing_ranks or waiting),
                steps=(step, step) if step is not None else None,
                text=f"hang: {ranks_label(waiting)} stuck {row.waiting_s:.0f} s in {row.op} #{row.seq} of "
                f"{row.group_name}{'' if step is None else f' at step {step}'}, {who}",
                evidence={
                    "group_name": row.group_name,
                    "seq": int(row.seq),
                    "op": row.op,
                    "waiting_ranks": waiting,
                    "missing_ranks": missing_ranks,
                    "waiting_s": float(row.waiting_s),
                    "hang_after_s": float(row.hang_after_s),
                },
                page="liveness",
            )
        )
    return found
