"""One framework's rank processes for a side-by-side benchmark, driven in lock-step.

A worker is ``python -m <bench> --worker KIND RANK WORLD PORT OUT [EXTRA...]``
(``worker_args`` reads that back). It prints ``ready`` once set up; answers each
``round N`` line on stdin with one ``done <payload>`` line; on ``end`` writes its
JSON result file to OUT and exits. Other output (a framework's own prints) is skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def worker_args(argv: list[str]) -> tuple[str, int, int, int, Path, list[str]]:
    """(kind, rank, world, port, out, extra) from ``--worker KIND RANK WORLD PORT OUT EXTRA...``."""
    kind, rank, world, port, out, *extra = argv[1:]
    return kind, int(rank), int(world), int(port), Path(out), extra


def serve_rounds(run_round: Callable[[int], str]) -> None:
    """The worker's side: say ``ready``, then answer each ``round N`` with ``done <run_round(i)>``
    until ``end`` (the caller then writes its result file)."""
    print("ready", flush=True)
    for i, line in enumerate(sys.stdin):
        if not line.strip() or line.split()[0] == "end":
            break
        print(f"done {run_round(i)}", flush=True)


def serve_timed_rounds(step: Callable[[], object], steps: int) -> None:
    """serve_rounds where a round is ``steps`` calls of ``step``, answered with its wall seconds."""

    def run_round(_: int) -> str:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return f"{time.perf_counter() - t0:.6f}"

    serve_rounds(run_round)


class RankGroup:
    def __init__(
        self,
        kind: str,
        module: str,
        python: str,
        env: dict,
        world: int,
        out_dir: Path,
        extra: list[str],
        timeout: float,
        *,
        name: str | None = None,
        cwd: Path | None = None,
    ) -> None:
        """``world`` workers of ``python -m module`` on a fresh port, each writing
        ``out_dir/<name>-rank<r>.json`` (stderr beside it; name defaults to kind)."""
        # Imported here, on the driver: workers import this module in DeepSpeed's venv,
        # which has no grpc for collector.testing to load.
        from collector.testing.ports import free_port

        self.kind, self.timeout = kind, timeout
        port = free_port()
        self.outs = [out_dir / f"{name or kind}-rank{r}.json" for r in range(world)]
        self.errs = [open(out.with_suffix(".err"), "w+") for out in self.outs]
        self.procs = [
            subprocess.Popen(
                [python, "-m", module, "--worker", kind, str(r), str(world), str(port), str(out), *extra],
                cwd=cwd or Path(__file__).resolve().parent.parent,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
            for r, (out, err) in enumerate(zip(self.outs, self.errs))
        ]
        self.expect("ready")

    def expect(self, word: str) -> list[str]:
        """Every rank's next line starting with ``word``, as the text after it."""
        got = []
        for r, p in enumerate(self.procs):
            line = p.stdout.readline()
            while line and not line.startswith(word):
                line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.kind} rank {r} died:\n{self.error(r)[-4000:]}")
            got.append(line[len(word) :].strip())
        return got

    def send(self, line: str) -> None:
        for p in self.procs:
            p.stdin.write(line + "\n")
            p.stdin.flush()

    def round(self, i: int) -> list[str]:
        """Run round ``i``; every rank's ``done`` payload."""
        self.send(f"round {i}")
        return self.expect("done")

    def finish(self) -> list[dict]:
        # every rank gets "end" before any is waited on: they may meet in a barrier on the way out
        self.send("end")
        for p in self.procs:
            p.stdin.close()
        for p in self.procs:
            p.wait(self.timeout)
        return [json.loads(o.read_text()) for o in self.outs]

    def error(self, rank: int = 0) -> str:
        self.errs[rank].seek(0)
        return self.errs[rank].read()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
