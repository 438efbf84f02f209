"""One framework's rank processes for a side-by-side benchmark, driven in lock-step.

The protocol every worker follows: print ``ready`` once set up; answer each
``round N`` line on stdin with one ``done <payload>`` line; on ``end`` write its
JSON result file and exit. Other output (a framework's own prints) is skipped.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


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
    def __init__(self, kind: str, commands: list[list[str]], outs: list[Path], cwd: Path, env: dict,
                 timeout: float) -> None:
        """``commands[r]`` starts rank r, which writes its result to ``outs[r]`` (stderr goes next to it)."""
        self.kind, self.timeout, self.outs = kind, timeout, outs
        self.errs = [open(out.with_suffix(".err"), "w+") for out in outs]
        self.procs = [subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=err, text=True) for cmd, err in zip(commands, self.errs)]
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
            got.append(line[len(word):].strip())
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
