"""``rankscope fr DIR``: a hung or failed job's Flight Recorder dumps, imported and judged in one command.

What a user runs first on a job that stopped: every rank's dump in ``DIR`` (any names torch's
writers give them: ``nccl_trace_rank_<r>``, a ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` prefix, host
names; pickles or JSON) is imported as one run (collector.tools.importers.flight_recorder: bad files
named and skipped), then judged as ``rankscope health`` judges a live hang: the collectives ranks
wait in that other members never entered (group, seq, op, who waits, who is missing and where it was
last seen), collectives entered with a different op, dtype or size, and ranks that left no dump at all
(crashed or killed: torch's analyzer says it "cannot decide" there; this says who). Under each
finding: the stack each missing or mismatched rank was last seen in, and what the waiting ranks wait in.

Exit codes as ``rankscope health``: 0 nothing found, 1 warnings (dumps missing and nothing else),
2 a hang or mismatch, 3 nothing could be imported.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from collector.data import findings, queries
from collector.data.findings import Finding
from collector.data.findings.model import ranks_label
from collector.tools.importers.flight_recorder import WITHOUT_DUMP
from collector.tools.importers.ingest import import_path, open_sink

NOTHING = 3
MAX_STACK_LINES = 8  # innermost lines of each stack printed; --json has them whole
MAX_STACK_RANKS = 4  # ranks whose stacks are printed under one finding


@dataclass
class Verdict:
    run_id: str
    findings: list[Finding]
    stacks: dict[int, list[dict]] = field(default_factory=dict)  # rank -> its newest stack rows
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return findings.exit_code(self.findings)


def judge(dumps: Path, data_dir, run: str | None = None) -> Verdict | None:
    """Imports ``dumps`` into ``data_dir`` as a run and judges it; None when nothing was importable."""
    with open_sink(data_dir) as sink:
        report = import_path(dumps, sink=sink, run=run)
    if not report.rows:
        return None
    cat = queries.Catalog(data_dir)
    try:
        run_id = report.run_id
        found = findings.liveness_findings(
            queries.hangs(cat, run_id), queries.desyncs(cat, run_id), queries.rank_liveness(cat, run_id)
        )
        without = report.hints.get(WITHOUT_DUMP, [])
        if without:
            found.append(_no_dump(without, report.world_size))
        suspects = sorted({r for f in found for r in f.ranks} | {r for f in found for r in _waiting(f)})
        frame = queries.stacks(cat, run_id, suspects) if suspects else None
    finally:
        cat.close()
    stacks: dict[int, list[dict]] = {}
    for row in [] if frame is None else frame.to_dict("records"):
        stacks.setdefault(int(row["rank"]), []).append(row)
    return Verdict(run_id, findings.ranked(found), stacks, report.notes, [str(p) for p in report.problems])


def _waiting(f: Finding) -> list[int]:
    return [int(r) for r in f.evidence.get("waiting_ranks", [])]


def _no_dump(ranks: list[int], world: int) -> Finding:
    return Finding(
        kind="missing_dump",
        severity="warning",
        ranks=tuple(ranks),
        text=f"no Flight Recorder dump from {ranks_label(ranks)} of {world}: crashed, killed or its file is not here "
        "(torch's analyzer cannot decide on the collectives it was in; they are judged on the ranks that dumped)",
        evidence={"ranks_without_dump": ranks, "world_size": world},
        page="liveness",
    )


def _stack_lines(rows: list[dict]) -> list[str]:
    out = []
    for row in rows:
        out.append(f"      {row['reason']} (thread {row['thread_name'] or '?'})")
        lines = [ln for ln in str(row["stack"] or "").splitlines() if ln.strip()]
        out += [f"      {ln}" for ln in lines[-MAX_STACK_LINES:]]
    return out


def text(v: Verdict) -> str:
    lines = [f"{v.run_id}: {f.severity}: {f.text}" for f in v.findings if f.severity != "info"]
    if not lines:
        lines.append(f"{v.run_id}: healthy, nothing to fix")
    for f in v.findings:
        # the missing or odd ranks, then one waiting rank (the others wait in the same call)
        shown = [r for r in f.ranks if r in v.stacks][:MAX_STACK_RANKS]
        shown += [r for r in _waiting(f) if r in v.stacks and r not in shown][:1]
        for r in shown:
            lines.append(f"  rank {r} ({'waiting' if r in _waiting(f) else f.kind}):")
            lines += _stack_lines(v.stacks[r])
    lines += [f"note: {n}" for n in v.notes]
    lines += [f"skipped: {p}" for p in v.problems]
    return "\n".join(lines)


def as_json(v: Verdict) -> str:
    return json.dumps(
        {
            "run_id": v.run_id,
            "exit_code": v.exit_code,
            "findings": [f.to_json() for f in v.findings],
            "stacks": {
                str(r): [{k: row[k] for k in ("reason", "thread_name", "innermost", "stack")} for row in rows]
                for r, rows in v.stacks.items()
            },
            "notes": v.notes,
            "skipped": v.problems,
        },
        indent=2,
        default=str,
    )


def main(args) -> int:
    from collector.server.ledger import DataDirBusy

    dumps = Path(args.dir)
    if not dumps.exists():
        print(f"rankscope fr: {dumps}: no such file or directory", file=sys.stderr)
        return NOTHING
    try:
        verdict = judge(dumps, args.data_dir, args.run)
    except DataDirBusy:
        print(f"rankscope fr: a collector is running on {args.data_dir}; give another --data-dir", file=sys.stderr)
        return NOTHING
    if verdict is None:
        print(f"rankscope fr: no Flight Recorder dump could be imported from {dumps}", file=sys.stderr)
        return NOTHING
    print(as_json(verdict) if args.json else text(verdict))
    return verdict.exit_code
