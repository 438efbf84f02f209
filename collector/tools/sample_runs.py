"""Regenerate ``sample_runs/``: the archived runs shipped for replay and the dashboard.

    python -m collector.tools.sample_runs --out sample_runs      # what `make sample-runs` runs

A real collector (a subprocess on a free port) records the scenario runs of
trainer.examples.scenarios, each a real torchrun job of the bundled engine
(started as a process, never imported: the tools do not depend on the engine),
into a fresh temporary data dir. A scenario that hangs never ends on its own:
once the collector's data shows its hang (the waiting ranks, the missing one and
its stack), the job is killed as a scheduler's timeout would kill it, so the
recorded run keeps its in-flight collectives and stays a hang (its status stays
``running``: no rank ever said it ended). Beside them, ``rankscope simulate``
writes a small many-rank run (SIMULATED) with a straggler into its own data dir, from
the step template derived from the new TEMPLATE_RUN; that template is also written to
collector/tools/simulate_template.json, so the shipped template and the shipped runs
always agree (tests/unit/tools/test_simulate.py re-derives it).

The collector is stopped with SIGINT so it commits everything, then each
(table, run) partition of both dirs is merged into one Parquet file in a new
data dir built beside --out (Parquet + placeholders + catalog.duckdb with
relative paths; the collector's ledger is a writer's journal that readers never
need, so it is left out). That dir is checked through
collector.data.catalog.connect and only then swapped in for --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from collector.data import catalog, layout, queries
from collector.data.schema import TABLES, as_stored, reading_schema
from collector.server.store import parquet_options, segment_order, segment_path
from collector.tools import simulate, simulate_template
from collector.tools.launch import collector_command, free_port, torchrun_command, wait_for_collector

RUN_TIMEOUT_S = 900
HANG_VISIBLE_TIMEOUT_S = 300  # from the job's start until its hang must show in the data
JOB_STOP_GRACE_S = 60  # torchrun's own SIGTERM -> SIGKILL grace for its workers is 30 s
TEMPLATE_RUN = "zero2-slow-rank3"  # the run whose step `rankscope simulate` repeats
# The shipped many-rank run: big enough to need the dashboard's rank binning, small enough to ship.
SIMULATED = dict(name="simulated-256-ranks", ranks=256, steps=30, stragglers=(simulate.Straggler(117, 40_000_000),))
# Shipped files are read many times and written once: compress harder than the live store does.
ARCHIVE_COMPRESSION_LEVEL = 9


class GenerationError(RuntimeError):
    """A step of the generation failed; --out is left untouched."""


def scenarios() -> dict[str, dict]:
    """The engine's sample-run scenarios: ``{name: {"ranks": N, "hang_step": S or None}}``."""
    out = subprocess.run(
        [sys.executable, "-m", "trainer.examples.scenarios", "--list"], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise GenerationError(f"cannot list the scenarios: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout)


def train(name: str, spec: dict, steps: int, endpoint: str, raw: Path) -> None:
    nproc = spec["ranks"]
    cmd = torchrun_command(
        nproc,
        "-m",
        "trainer.examples.scenarios",
        "--scenario",
        name,
        "--steps",
        str(steps),
    )
    # The run name travels by env: torchrun would take `--run` for its own --run-path.
    env = dict(os.environ, RANKSCOPE_ENDPOINT=endpoint, RANKSCOPE_RUN=name, OMP_NUM_THREADS="1")
    print(f"[sample-runs] {name}: {nproc} ranks, {steps} steps", flush=True)
    if spec["hang_step"] is not None:
        _train_until_hang_recorded(name, spec["hang_step"], cmd, env, raw)
        return
    try:
        rc = subprocess.run(cmd, env=env, timeout=RUN_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        raise GenerationError(f"scenario {name} did not finish within {RUN_TIMEOUT_S}s") from None
    if rc != 0:
        raise GenerationError(f"scenario {name} failed (torchrun exit {rc}); its output is above")


def _train_until_hang_recorded(name: str, hang_step: int, cmd: list[str], env: dict, raw: Path) -> None:
    """Start the job, wait until ``raw`` shows its hang, then end it as a scheduler's job timeout
    does: SIGTERM to torchrun, which passes it on to its ranks (SIGKILL if they outlive the grace
    period). No rank gets to say it ended, so the hang is what the recorded run shows."""
    job = subprocess.Popen(cmd, env=env)
    began = time.monotonic()
    try:
        while not _hang_recorded(raw, name, hang_step):
            if job.poll() is not None:
                raise GenerationError(f"scenario {name} ended (torchrun exit {job.returncode}) without hanging")
            if time.monotonic() - began > HANG_VISIBLE_TIMEOUT_S:
                raise GenerationError(f"scenario {name} showed no recorded hang within {HANG_VISIBLE_TIMEOUT_S}s")
            time.sleep(1.0)
        print(f"[sample-runs] {name}: hang recorded {time.monotonic() - began:.0f} s in; ending the job", flush=True)
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)  # torchrun's agent stops its workers' process groups
            try:
                job.wait(timeout=JOB_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait(timeout=60)


def _hang_recorded(raw: Path, name: str, hang_step: int) -> bool:
    """The run's hang at ``hang_step`` is in the data: every other rank waiting, and the missing
    ranks' stacks (a slow start can make an earlier collective wait past hang_after_s too)."""
    try:
        cat = queries.Catalog(raw)
    except queries.DataDirError:
        return False
    try:
        run_id = queries.resolve_run(cat.cursor(), name)
        hangs = queries.hangs(cat, run_id)
        hangs = hangs[hangs.step >= hang_step]
        if hangs.empty or not len(hangs.iloc[0].missing_ranks):
            return False
        row = hangs.iloc[0]
        world = int(cat.df("SELECT world_size FROM runs WHERE run_id = ?", [run_id]).world_size.iloc[0])
        stacks = queries.stacks(cat, run_id, [int(r) for r in row.missing_ranks])
        return len(row.waiting_ranks) + len(row.missing_ranks) == world and not stacks.empty
    except (LookupError, duckdb.Error):  # the run is not in the catalog yet, or a segment is mid-write
        return False
    finally:
        cat.close()


def record(raw: Path, names: dict[str, dict], steps: int) -> None:
    """Run the scenarios against a collector writing into ``raw``; stop it so it commits."""
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    # the archived runs are the scenarios as trained: no capture changing a profiled rank's steps
    command = [*collector_command(str(raw), port=port), "--no-auto-profile"]
    collector = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        _wait_until_listening(collector, endpoint)
        for name in names:
            train(name, names[name], steps, endpoint, raw)
    finally:
        collector.send_signal(signal.SIGINT)  # serve() commits what is buffered on SIGINT
        try:
            rc = collector.wait(timeout=60)
        except subprocess.TimeoutExpired:
            collector.kill()
            raise GenerationError("the collector did not stop within 60s of SIGINT") from None
    if rc != 0:
        raise GenerationError(f"the collector exited with {rc}")


def _wait_until_listening(collector: subprocess.Popen, endpoint: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while collector.poll() is None:
        try:
            wait_for_collector(endpoint, timeout_s=1.0)
            return
        except TimeoutError:
            if time.monotonic() > deadline:
                raise GenerationError(f"the collector at {endpoint} did not answer within {timeout_s:.0f}s") from None
    raise GenerationError(f"the collector exited with {collector.returncode} before listening; its output is above")


def simulate_run(recorded: Path, raw: Path) -> str:
    """Derive the step template from TEMPLATE_RUN in ``recorded`` and ship it; write the
    SIMULATED many-rank run from it into ``raw`` (its own data dir); returns the run's name."""
    template = simulate_template.derive(recorded, TEMPLATE_RUN)
    simulate_template.SHIPPED.write_text(template.to_json())
    print(f"[sample-runs] {simulate_template.SHIPPED.name}: derived from {TEMPLATE_RUN}", flush=True)
    sim = simulate.Simulation(**SIMULATED, template=template)
    print(f"[sample-runs] {sim.name}: {sim.ranks} ranks, {sim.steps} steps (simulated)", flush=True)
    simulate.write_data_dir(sim, raw)
    return sim.name


def compact(raws: list[Path], dest: Path) -> None:
    """One Parquet file per (table, run), rows in commit order, into a fresh data dir ``dest``."""
    for table, schema in layout.stored_schemas().items():
        by_run: dict[str, list] = {}  # every raw dir's shared run=@all partition goes into one file
        for part in (part for raw in raws for part in layout.partitions(raw, table)):
            by_run.setdefault(layout.run_of(part), []).extend(
                sorted((p for p in part.glob(f"*{layout.SEGMENT_SUFFIX}") if segment_order(p)), key=segment_order)
            )
        for run_id, segments in by_run.items():
            if not segments:
                continue
            rows = as_stored(pa.concat_tables([pq.read_table(p, schema=reading_schema(schema)) for p in segments]))
            out = segment_path(dest, table, run_id, "cmp", 0)
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, out, **dict(parquet_options(schema), compression_level=ARCHIVE_COMPRESSION_LEVEL))
    catalog.ensure_catalog(dest)  # writes the placeholders and the views


def check(dest: Path, expected: dict[str, str]) -> None:
    """Every run is in ``dest`` with its ``{name: status}``."""
    con = catalog.connect(dest)
    try:
        status = dict(con.execute("SELECT name, status FROM runs").fetchall())
    finally:
        con.close()
    for name, want in expected.items():
        if status.get(name) != want:
            raise GenerationError(f"run {name} is {status.get(name, 'missing')!r} in the new data, not {want!r}")


def swap_in(new: Path, out: Path) -> None:
    """Replace ``out`` by ``new`` (both in the same folder): two renames, so ``out`` is
    at every moment either the old complete data or the new."""
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(new, out)
        shutil.rmtree(old)
    else:
        os.replace(new, out)


def summary(out: Path) -> str:
    con = catalog.connect(out)
    try:
        lines = ["runs:"]
        for name, world, status in con.execute("SELECT name, world_size, status FROM runs ORDER BY name").fetchall():
            lines.append(f"  {name:24s} {world} ranks  {status}")
        lines.append("rows per table:")
        for table in ["runs", "ranks", *TABLES]:
            n = con.execute(f"SELECT count(*) FROM {catalog.quote_ident(table)}").fetchone()[0]
            lines.append(f"  {table:12s} {n:8d}")
    finally:
        con.close()
    files = [p for p in out.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    lines.append(f"size on disk: {size / 1e6:.2f} MB in {len(files)} files ({out})")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description="Regenerate the shipped sample runs with the real engine and collector.")
    p.add_argument("--out", default="sample_runs", help="data dir to replace (default: sample_runs)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    p.add_argument(
        "--only", nargs="+", metavar="SCENARIO", help="scenarios to run (default: all, then the simulated run)"
    )
    args = p.parse_args()
    try:
        known = scenarios()
    except GenerationError as exc:
        print(f"sample_runs: {exc}", file=sys.stderr)
        return 1
    unknown = sorted(set(args.only or ()) - set(known))
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    chosen = {name: known[name] for name in (args.only or known)}
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}.new.", dir=out.parent))
    build.chmod(0o755)  # mkdtemp's 0700 would become --out's mode
    try:
        expected = {name: "finished" if spec["hang_step"] is None else "running" for name, spec in chosen.items()}
        with tempfile.TemporaryDirectory(prefix="rankscope-sample-runs-") as tmp:
            recorded, simulated = Path(tmp, "recorded"), Path(tmp, "simulated")
            record(recorded, chosen, args.steps)
            raws = [recorded]
            if not args.only:
                expected[simulate_run(recorded, simulated)] = "finished"
                raws.append(simulated)
            compact(raws, build)
        check(build, expected)
        swap_in(build, out)
    except GenerationError as exc:
        print(f"sample_runs: {exc}; {out} left as it was", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(build, ignore_errors=True)
    print(summary(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
