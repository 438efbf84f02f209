"""A straggler's cost by its two models, on the fault suite's data-parallel cases (issue 47's "one
cost model"): arrival lateness (the wait the rank imposed at collectives, less its own waiting in the
step) and the what-if replay's saving (a replay of each step with the rank's ops at the step's typical
durations, collector.data.whatif.dp), against the step-time rise the case's script measured.

    python -m benches.faults --only ddp-healthy,ddp-straggler-50ms,...,engine --work W --out W.md
    python -m benches.whatif_costs W [W2 ...]

Reads the stored runs of each ``benches.faults --work`` directory (its data dir, its scripts' step
times) with the code checked out now: no run is repeated. Per straggler case: the finding's
``evidence.lateness_ms_per_step`` and ``evidence.replay_ms_per_step`` (the same steps: since the onset
for a late onset, the whole run otherwise), how far apart they are, and each one's error against the
measured rise: the case's mean step (its script's, the first 2 left out; since the onset for a late
onset) less its source's healthy case's median step, as ``benches.faults`` scores the cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benches import faults
from collector.data import whatif

CASES = (
    "ddp-healthy",
    "ddp-straggler-50ms",
    "ddp-straggler-20ms",
    "ddp-straggler-rank0",
    "ddp-late-onset",
    "ddp-intermittent",
    "ddp-data-loader",
    "ddp-gc-pauses",
    "ddp-4-ranks-healthy",
    "ddp-4-ranks-straggler",
)
AGREE = 0.10  # issue 47: within 10%


def _stored(work: Path) -> list[tuple[faults.Case, list[float], int, list[dict]]]:
    """(case, its script's step times, the loop index -> step shift, its findings now) per stored case."""
    out = []
    for case in faults.cases():
        if case.source == "ddp" and case.name in CASES:
            times = work / case.name / "times.json"
            run, shift = case.name, 1  # hook steps count from 1: loop index i is step i + 1
            t = json.loads(times.read_text()) if times.exists() else None
        elif case.source == "engine":
            times = work / "engine-times.json"
            run, shift = "engine-" + case.args[0].replace(":", "").replace("@", "from"), 0
            t = json.loads(times.read_text()).get(run) if times.exists() else None
        else:
            continue
        if t is None:
            continue
        whatif._CACHE.clear()  # each case replayed by this code, not a cached answer
        out.append((case, t, shift, faults.poll_health(work / "data", run)))
    return out


def rows(work: Path) -> list[dict]:
    stored = _stored(work)
    healthy = {c.source: 1e3 * statistics.median(t[2:]) for c, t, _, _ in stored if c.name in faults.BASELINES}
    out = []
    for case, t, shift, found in stored:
        if not case.expect or case.source not in healthy:
            continue
        for f in found:
            if f["kind"] != "straggler" or f["severity"] != "warning":
                continue
            ev = f["evidence"]
            onset = ev.get("onset_step") if case.expect[0].onset is not None else None
            since = max(2, onset - shift) if onset is not None else 2
            rise = 1e3 * statistics.fmean(t[since:]) - healthy[case.source]
            late, replay = ev.get("lateness_ms_per_step", f["cost_ms_per_step"]), ev.get("replay_ms_per_step")
            out.append(
                dict(
                    case=case.name,
                    ranks=f["ranks"],
                    since=onset,
                    lateness=late,
                    replay=replay,
                    cost=f["cost_ms_per_step"],
                    model=ev.get("cost_model"),
                    rise=rise,
                    apart=None if replay is None or late <= 0 else abs(replay - late) / late,
                    err_lateness=abs(late - rise) / rise if rise > 0 else None,
                    err_replay=abs(replay - rise) / rise if rise > 0 and replay is not None else None,
                )
            )
    return out


def table(label: str, found: list[dict]) -> str:
    lines = [
        f"**{label}**",
        "",
        "| case | rank | lateness ms/step | replay ms/step | apart | agree (10%) | measured rise ms/step "
        "| lateness error | replay error | cost (model) |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---|",
    ]

    def pct(x):
        return "" if x is None else f"{100 * x:.0f}%"

    for r in found:
        since = f" (since step {r['since']})" if r["since"] is not None else ""
        agree = "" if r["apart"] is None else ("yes" if r["apart"] <= AGREE else "**no**")
        replay = "" if r["replay"] is None else f"{r['replay']:.1f}"
        lines.append(
            f"| {r['case']}{since} | {','.join(map(str, r['ranks']))} | {r['lateness']:.1f} | {replay} "
            f"| {pct(r['apart'])} | {agree} | {r['rise']:.1f} | {pct(r['err_lateness'])} | {pct(r['err_replay'])} "
            f"| {r['cost']:.1f} ({r['model']}) |"
        )
    paired = [r for r in found if r["apart"] is not None]
    agree = sum(r["apart"] <= AGREE for r in paired)
    el = [r["err_lateness"] for r in found if r["err_lateness"] is not None]
    er = [r["err_replay"] for r in found if r["err_replay"] is not None]
    closer = sum(r["err_replay"] <= r["err_lateness"] for r in found if r["err_replay"] is not None)
    if el and er:
        lines += [
            "",
            f"Within 10%: {agree} of {len(paired)}. Error against the rise: lateness median "
            f"{pct(statistics.median(el))} (max {pct(max(el))}), replay median {pct(statistics.median(er))} "
            f"(max {pct(max(er))}); the replay is the closer in {closer} of {len(er)}.",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("work", nargs="+", help="benches.faults --work directories")
    args = p.parse_args(argv)
    for work in args.work:
        print(table(work, rows(Path(work))), end="\n\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
