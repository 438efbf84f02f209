"""``rankscope health RUN``'s fast path: ask the collector serving the data dir for the findings it
holds in memory (its Health RPC; collector.server.live_findings) instead of computing them again.

The collector found in ``D/collector.json`` follows a run live while a rank of it streams there
(collector.data.live_collector.fetch asks it): its findings are the stored-data ones of its last
refresh (at most ``refresh_s`` old) with the live judgment of stuck and hung collectives, current
to a quarter of a second, and of ranks gone without ending the run, from the moment their streams
close. This path imports grpc and the stubs, never pandas or duckdb, so the
answer is printed in a fraction of a second where computing it costs seconds of CPU.

``ask`` returns None when there is nothing to ask (no collector advertised, it does not answer
in time, refuses the token, or does not follow the run): the caller computes from the data dir
then (collector.tools.health). The lines printed and the exit code are those of the
data-dir path, captured evidence included (the collector's refresh diffs each capture once); what
only the data dir has (retention notes, resent-spool notes) is left to it.
"""

from __future__ import annotations

import argparse
import json
import sys

from collector.data import live_collector

SEVERITY_EXIT = {"critical": 2, "warning": 1}


def lines(found: list[dict], run_id: str, notes: bool = False) -> list[str]:
    """The findings' lines as `rankscope health` prints them, from findings as JSON (the live answer's
    form; collector.tools.health.report gives its Findings in it too, so both paths print alike)."""
    problems = [f for f in found if f["severity"] in ("critical", "warning")]
    infos = [f for f in found if f["severity"] == "info"]
    out = [f"{run_id}: {f['severity']}: {f['text']}" for f in problems]
    if not problems:
        hint = f" ({len(infos)} note{'s' * (len(infos) != 1)}: --all shows them)" if infos and not notes else ""
        out.append(f"{run_id}: healthy, nothing to fix{hint}")
    if notes:
        out += [f"{run_id}: info: {f['text']}" for f in infos]
    return out


def evidence_lines(run_id: str, captured: list[dict]) -> list[str]:
    """The ``evidence:`` lines of captured profile diffs (collector.data.trace_diff.evidence's dicts)."""
    return [
        f"{run_id}: evidence: {e.get('headline') or e.get('error')} (request {e['request_id']}, steps {e.get('steps')})"
        for e in captured
    ]


def exit_code(found: list[dict]) -> int:
    return max((SEVERITY_EXIT.get(f["severity"], 0) for f in found), default=0)


def ask(args: argparse.Namespace) -> int | None:
    """Print the live collector's answer and return the exit code; None: not answered here."""
    answer = live_collector.fetch(args.data_dir, args.run)
    if answer is None:
        return None
    run_id, found, _, captured = answer
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        print("\n".join(lines(found, run_id, notes=args.all) + evidence_lines(run_id, captured)))
    sys.stdout.flush()
    return exit_code(found)
