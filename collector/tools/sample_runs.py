"""Regenerate ``sample_runs/``: the archived runs shipped for replay and the dashboard.

    python -m collector.tools.sample_runs --out sample_runs      # what `make sample-runs` runs

A real collector (a subprocess on a free port) records the scenario runs of
trainer.examples.scenarios, each a real torchrun job of the bundled engine
(started as a process, never imported: the tools do not depend on the engine),
into a fresh temporary data dir. The collector is stopped with SIGINT so it
commits everything, then each (table, run) partition is merged into one
Parquet file in a new data dir built beside --out (Parquet + placeholders +
catalog.duckdb with relative paths; the collector's ledger is a writer's
journal that readers never need, so it is left out). That dir is checked
through collector.data.catalog.connect and only then swapped in for --out.
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

import pyarrow as pa
import pyarrow.parquet as pq

from collector.data import catalog, layout
from collector.data.schema import TABLES
from collector.server.store import parquet_options, segment_order, segment_path
from collector.tools.launch import collector_command, free_port, torchrun_command, wait_for_collector

RUN_TIMEOUT_S = 900
# Shipped files are read many times and written once: compress harder than the live store does.
ARCHIVE_COMPRESSION_LEVEL = 9


class GenerationError(RuntimeError):
    """A step of the generation failed; --out is left untouched."""


def scenarios() -> dict[str, int]:
    """The engine's sample-run scenarios and their rank counts."""
    out = subprocess.run(
        [sys.executable, "-m", "trainer.examples.scenarios", "--list"], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise GenerationError(f"cannot list the scenarios: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout)


def train(name: str, nproc: int, steps: int, endpoint: str) -> None:
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
    try:
        rc = subprocess.run(cmd, env=env, timeout=RUN_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        raise GenerationError(f"scenario {name} did not finish within {RUN_TIMEOUT_S}s") from None
    if rc != 0:
        raise GenerationError(f"scenario {name} failed (torchrun exit {rc}); its output is above")


def record(raw: Path, names: dict[str, int], steps: int) -> None:
    """Run the scenarios against a collector writing into ``raw``; stop it so it commits."""
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    collector = subprocess.Popen(collector_command(str(raw), port=port), stdout=subprocess.DEVNULL)
    try:
        _wait_until_listening(collector, endpoint)
        for name in names:
            train(name, names[name], steps, endpoint)
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


def compact(raw: Path, dest: Path) -> None:
    """One Parquet file per (table, run), rows in commit order, into a fresh data dir ``dest``."""
    for table, schema in layout.stored_schemas().items():
        for part in layout.partitions(raw, table):
            segments = sorted(
                (p for p in part.glob(f"*{layout.SEGMENT_SUFFIX}") if segment_order(p)), key=segment_order
            )
            if not segments:
                continue
            rows = pa.concat_tables([pq.read_table(p, schema=schema) for p in segments])
            out = segment_path(dest, table, layout.run_of(part), "cmp", 0)
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, out, **dict(parquet_options(schema), compression_level=ARCHIVE_COMPRESSION_LEVEL))
    catalog.ensure_catalog(dest)  # writes the placeholders and the views


def check(dest: Path, names: list[str]) -> None:
    con = catalog.connect(dest)
    try:
        status = dict(con.execute("SELECT name, status FROM runs").fetchall())
    finally:
        con.close()
    for name in names:
        if status.get(name) != "finished":
            raise GenerationError(f"run {name} is {status.get(name, 'missing')!r} in the new data, not 'finished'")


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
    p.add_argument("--only", nargs="+", metavar="SCENARIO", help="scenarios to run (default: all)")
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
        with tempfile.TemporaryDirectory(prefix="rankscope-sample-runs-") as raw:
            record(Path(raw), chosen, args.steps)
            compact(Path(raw), build)
        check(build, list(chosen))
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
