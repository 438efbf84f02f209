"""The per-step pattern ``rankscope simulate`` repeats, taken from a real engine run.

A template is one step of one rank, as the engine recorded it: the collectives in the
order issued (op, log name, dtype, size, async, when in the step it was entered and how
long the data took to move once everyone had arrived), the timers (name, start, length),
the monitor tags (value at the start and at the end of the run) and the memory kinds.

It ships with the package as ``simulate_template.json`` (a few kB), derived by
``derive(data_dir, run)`` from the sample run ``zero2-slow-rank3``: a user installing
rankscope from a wheel has no sample_runs/, and a simulation must not change when
someone re-records the samples. ``tests/unit/tools/test_simulate.py`` re-derives it from
sample_runs/ and checks it is still the same, so the two cannot drift apart;
``python -m collector.tools.simulate_template sample_runs zero2-slow-rank3 > F`` rewrites it.

Robust statistics throughout (medians over ranks and steps): the sample run has a slow rank,
and the template must describe a healthy step; ``simulate --straggler`` adds the slowness back.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

SHIPPED = Path(__file__).with_name("simulate_template.json")


@dataclass(frozen=True)
class Collective:
    op: str
    log_name: str
    dtype: str
    numel: int
    bytes: int
    async_op: bool
    offset_ns: int  # entered this long after the step's first collective
    transfer_ns: int  # from the last rank's arrival to the end: the data moving


@dataclass(frozen=True)
class Timer:
    name: str
    offset_ns: int  # from the step's first timer start
    dur_ns: int


@dataclass(frozen=True)
class Tag:
    tag: str
    first: float  # the value over the first steps...
    last: float  # ...and over the last ones; a simulation interpolates
    per_rank: bool  # differs across ranks (throughput) rather than one value for the run (loss, lr)


@dataclass(frozen=True)
class Template:
    source_run: str
    step_period_ns: int
    collective_offset_ns: int  # the first collective, after the step's first timer start
    collectives: tuple[Collective, ...]
    timers: tuple[Timer, ...]
    monitor: tuple[Tag, ...]
    memory: tuple[tuple[str, int], ...]  # (kind, bytes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Template:
        raw = json.loads(text)
        return cls(
            source_run=raw["source_run"],
            step_period_ns=int(raw["step_period_ns"]),
            collective_offset_ns=int(raw["collective_offset_ns"]),
            collectives=tuple(Collective(**c) for c in raw["collectives"]),
            timers=tuple(Timer(**t) for t in raw["timers"]),
            monitor=tuple(Tag(**t) for t in raw["monitor"]),
            memory=tuple((k, int(b)) for k, b in raw["memory"]),
        )


def load(path: Path | None = None) -> Template:
    return Template.from_json(Path(path or SHIPPED).read_text())


def derive(data_dir, run: str) -> Template:
    """The template of ``run`` (id or name) in ``data_dir``: its most common step signature."""
    from collector.data import queries  # duckdb: only when deriving, never when simulating

    cat = queries.Catalog(data_dir)
    try:
        run_id = queries.resolve_run(cat.con, run)
        comm = cat.df(
            "SELECT rank, step, seq, op, log_name, dtype, numel, bytes, async_op, start_ns, end_ns "
            "FROM comm WHERE run_id = ? ORDER BY rank, step, start_ns",
            [run_id],
        )
        timers = cat.df("SELECT rank, step, name, start_ns, dur_ns FROM timers WHERE run_id = ?", [run_id])
        monitor = cat.df("SELECT rank, step, tag, value FROM monitor WHERE run_id = ?", [run_id])
        memory = cat.df(
            "SELECT kind, median(bytes)::BIGINT AS bytes FROM memory WHERE run_id = ? GROUP BY kind", [run_id]
        )
    finally:
        cat.close()

    # The step signature most steps of rank 0 share; warm-up steps differ and are left out.
    sig = (
        comm[comm["rank"] == comm["rank"].min()]
        .groupby("step")
        .apply(lambda s: tuple(zip(s.op, s.log_name, s.bytes, strict=True)), include_groups=False)
    )
    common = Counter(sig.tolist()).most_common(1)[0][0]
    steps = set(sig.index[sig.map(lambda s: s == common)])
    comm = comm[comm.step.isin(steps)].copy()
    comm["pos"] = comm.groupby(["rank", "step"]).cumcount()
    step_start = timers.groupby(["rank", "step"]).start_ns.min().rename("t0")
    comm = comm.join(step_start, on=["rank", "step"])
    inst = comm.groupby(["step", "seq"]).agg(last=("start_ns", "max"), end=("end_ns", "min"))
    comm = comm.join(inst, on=["step", "seq"])
    comm["first_in_step"] = comm.groupby(["rank", "step"]).start_ns.transform("min")
    comm["offset"] = comm.start_ns - comm.first_in_step
    comm["transfer"] = (comm.end - comm["last"]).clip(lower=1000)
    per_pos = comm.groupby("pos").agg(offset=("offset", "median"), transfer=("transfer", "median"))
    first = comm[comm["rank"] == comm["rank"].min()].groupby("pos").first()
    collectives = tuple(
        Collective(
            op=str(first.op[p]),
            log_name=str(first.log_name[p]),
            dtype=str(first.dtype[p]),
            numel=int(first.numel[p]),
            bytes=int(first.bytes[p]),
            async_op=bool(first.async_op[p]),
            offset_ns=int(per_pos.offset[p]),
            transfer_ns=int(per_pos.transfer[p]),
        )
        for p in sorted(per_pos.index)
    )
    collective_offset = int((comm.groupby(["rank", "step"]).first_in_step.first() - step_start).median())

    timers = timers.join(step_start, on=["rank", "step"])
    timers["offset"] = timers.start_ns - timers.t0
    per_timer = timers.groupby("name").agg(offset=("offset", "median"), dur=("dur_ns", "median"))
    periods = step_start.groupby(level="rank").diff().dropna()

    n_steps = monitor.step.nunique()
    edge = max(1, n_steps // 5)
    lo, hi = sorted(monitor.step.unique())[:edge], sorted(monitor.step.unique())[-edge:]
    tags = []
    for tag, rows in monitor.groupby("tag", sort=True):
        spread = rows.groupby("step").value.agg(lambda v: v.max() - v.min()).median()
        tags.append(
            Tag(
                tag=str(tag),
                first=float(rows[rows.step.isin(lo)].value.median()),
                last=float(rows[rows.step.isin(hi)].value.median()),
                per_rank=bool(spread > 1e-9 * max(1.0, abs(rows.value.median()))),
            )
        )
    return Template(
        source_run=str(run),
        step_period_ns=int(periods.median()),
        collective_offset_ns=collective_offset,
        collectives=collectives,
        timers=tuple(
            Timer(name=str(n), offset_ns=int(r.offset), dur_ns=int(r.dur))
            for n, r in per_timer.sort_values("offset").iterrows()
        ),
        monitor=tuple(tags),
        memory=tuple((str(k), int(b)) for k, b in memory.sort_values("kind").itertuples(index=False)),
    )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m collector.tools.simulate_template DATA_DIR RUN > simulate_template.json")
    sys.stdout.write(derive(sys.argv[1], sys.argv[2]).to_json())
