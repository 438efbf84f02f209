"""``rankscope whatif RUN``: the what-if figures of a run (collector.data.whatif), as a short
report or (``--json``) every figure. Exit 0 when the run was replayed, 3 when the run or data
dir could not be read or the run has nothing to replay (the message says why)."""

from __future__ import annotations

import argparse
import json
import sys

from collector.data import queries, whatif
from collector.data.findings.whatif import describe

UNREADABLE = 3


def main(args: argparse.Namespace) -> int:
    try:
        cat = queries.Catalog(args.data_dir)
    except queries.DataDirError as exc:
        print(f"rankscope whatif: {exc}", file=sys.stderr)
        return UNREADABLE
    try:
        run_id = queries.resolve_run(cat.con, args.run)
        result = whatif.for_run(cat, run_id)
    except queries.UnknownRun as exc:
        print(f"rankscope whatif: {exc} in {args.data_dir}", file=sys.stderr)
        return UNREADABLE
    except (whatif.NoSteps, whatif.GraphError) as exc:
        print(f"rankscope whatif: run {args.run}: {exc}", file=sys.stderr)
        return UNREADABLE
    finally:
        cat.close()
    if args.json:
        print(json.dumps({"run_id": run_id, **result}, indent=2))
        return 0
    print(report(run_id, result))
    return 0


def _top(d: dict, n: int = 4) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in list(d.items())[:n])


def report(run_id: str, r: dict) -> str:
    lines = [
        f"{run_id}: slowdown S = {r['slowdown']:.3f} ({r['step_time_s']:.3f} s a step as run, "
        f"{r['ideal_step_time_s']:.3f} s with every op at its typical duration; {r['steps']} steps replayed)",
        f"  by op type:  {_top(r['by_optype'])}",
        f"  by stage:    {_top(r['by_stage'])}",
        f"  by dp_rank:  {_top(r['by_dp_rank'])}",
        f"  by worker:   {_top(r['by_worker'])} (rank: slowdown)",
        f"  M_W = {_share(r['m_w'])} (workers {', '.join(map(str, r['m_w_workers']))}), M_S = {_share(r['m_s'])}",
        "  fixing one worker alone saves a step: "
        + ", ".join(f"rank {rank} {seconds * 1e3:,.1f} ms" for rank, seconds in r["saved_s"].items()),
    ]
    if r["dropped_steps"]:
        lines.append(f"  left out {len(r['dropped_steps'])} steps some replica did not record in full")
    verdict = describe(r)
    if verdict:
        lines.append(f"  {verdict.text}")
    return "\n".join(lines)


def _share(v) -> str:
    return "n/a" if v is None else f"{v:.1%}"
