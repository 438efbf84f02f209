"""``rankscope health RUN``: the current findings of a run, for people and for scripts.

One line per warning or critical finding, most urgent first; a run with none says it is
healthy in one line, with the number of notes (``info``: where communication time goes,
latency-bound messages) that ``--all`` prints too. ``--json`` prints every finding as a
JSON list (kind, severity, ranks, steps, text, cost_ms_per_step, evidence, page, filters). The exit code is for job
scripts and schedulers: 0 nothing to report, 1 warnings, 2 something critical
(a hang, a collective mismatch, a silent rank), 3 the run or data dir could not
be read.

Captured evidence (collector.data.trace_diff: a suspect's and a reference's profiles, diffed) is
one ``evidence:`` line per capture, and in ``--json`` the ``captured`` list of each finding that
names the suspect (headline, per-family lines, the traces' paths under the data dir).
"""

from __future__ import annotations

import argparse
import json
import sys

from collector.data import findings, queries, retention, trace_diff
from collector.server import resends, write_status
from collector.tools import live_health

UNREADABLE = 3


def report(
    findings_: list[findings.Finding],
    run_id: str,
    notes: bool = False,
    retained_state: dict | None = None,
    resent: str | None = None,
) -> str:
    lines = live_health.lines([{"severity": f.severity, "text": f.text} for f in findings_], run_id, notes)
    if not notes:  # a gap is said even in a healthy run: part of its data arrived late, resent
        lines += [f"{run_id}: note: {f.text}" for f in findings_ if f.kind == "network_gap" and f.severity == "info"]
    if retained_state:
        lines.append(f"{run_id}: note: {retention.note(retained_state)}")
    if resent:
        lines.append(f"{run_id}: note: {resent}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        cat = queries.Catalog(args.data_dir)
    except queries.DataDirError as exc:
        print(f"rankscope health: {exc}", file=sys.stderr)
        return UNREADABLE
    try:
        run_id = queries.resolve_run(cat.con, args.run)
        found = findings.for_run(cat, run_id)
        retained = queries.retention(cat, run_id)
        captured = trace_diff.run_evidence(cat, args.data_dir, run_id)
    except queries.UnknownRun as exc:
        print(f"rankscope health: {exc} in {args.data_dir}", file=sys.stderr)
        return UNREADABLE
    finally:
        cat.close()
    disk = write_status.note(args.data_dir)
    if disk:  # before the findings: what is stored may be behind
        print(f"{run_id}: warning: {disk}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps([trace_diff.attach(f.to_json(), captured) for f in found], indent=2))
    else:
        resent = resends.note_for_run(args.data_dir, run_id)
        print(report(found, run_id, notes=args.all, retained_state=retained, resent=resent))
        for line in live_health.evidence_lines(run_id, captured):
            print(line)
    return max(findings.exit_code(found), 1 if disk else 0)
