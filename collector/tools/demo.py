"""`rankscope demo`: a collector, a live multi-rank CPU training run of the
example GPT streaming into it, and the dashboard, all on this machine.

The console is for a person trying the tool for the first time: where the
collector and the dashboard are, the training's progress, and each warning
once. Every rank of the run prints the same library warnings, so the training's
output goes through ``OnceFilter``, which drops a line identical to one already
shown, and shows a training progress line only every ``PROGRESS_EVERY`` steps.

It trains until Ctrl-C (or ``--steps``), on a collector port and a spool dir of its
own (a free port, a fresh temporary dir), so it neither receives nor resends other
processes' telemetry meant for the default endpoint. The collector advertises its port in
the data dir (collector.data.live_collector), so ``rankscope health|profile|stacks`` find it
with no flag; the banner prints those lines for the demo's run. After a healthy start it stages
a fault (``--straggler``, by default rank 1 slowed by 40 ms per step from step 300), so the
first minutes show a finding appear live, its cost rise, and the collector's automatic
evidence (a profile of the straggler and a reference rank) arrive; the console tells each.

Stopping, whatever stops it (collector.tools.supervise):
* Ctrl-C. Started by another program in the terminal's foreground (``make demo``), the demo makes
  itself the terminal's foreground process group, so Ctrl-C reaches the demo and its dashboard,
  not make, which then exits with the demo's 0 instead of dying of SIGINT ("Error 130"). The training
  and the collector have process groups of their own: the demo stops the training first, then the
  collector, so the ranks' last records and RunEnd still land.
* SIGTERM, SIGHUP: as Ctrl-C.
* the demo itself killed (SIGKILL, its parent gone): its dashboard and torchrun get a death signal
  from the kernel (PR_SET_PDEATHSIG), each rank one when torchrun goes, and the demo's guard
  (``supervise --guard``) waits for the training to end, then stops the collector and removes the
  spool dir, so the ranks' RunEnd ("stopped") still lands.
Each rank notes a stop signal as its user's (collector.rank.session.note_stopped), so the run ends
``stopped``, not ``failed``. What the ranks spooled unacked is delivered to the collector before it
stops; the spool dir is removed once empty. A rank whose RunEnd still did not reach the collector
(killed in a collective after the stop's grace, starved of CPU, stopped before its Hello) gets one,
``stopped``, from the demo or its guard (supervise.end_unended_runs), so the run never reads ``running``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from collector.tools.commands.common import DEFAULT_DATA_DIR
from collector.tools.launch import CollectorProcess, dashboard_command, free_port, torchrun_command
from collector.tools.supervise import children, deliver_spooled, die_with_parent, end_unended_runs, stop_training

EXAMPLE_CONFIG = "zero2.json"  # a bundled config of trainer.examples, named, not looked up
UNTIL_STOPPED = 10**9  # "--steps" when none is given: train until Ctrl-C
PROGRESS_EVERY = 50
_PROGRESS = re.compile(r"^\[\w+\] step (\d+) loss |^\[engine\] step=(\d+) ")
_ENGINE_TIMERS = "time (ms) |"  # the engine's breakdown line, printed right after its step line
_PROFILER_NOISE = "USDT:"  # kineto's "profiler_start"/"profiler_stop" lines while the collector profiles a rank


RUN_NAME = "demo"
STOP_TRAINING_S = 30.0  # the ranks' time to flush and send RunEnd once asked to stop, then SIGKILL
EVIDENCE_POLL_S = 2.0  # how often the console looks for new evidence files (a directory listing)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


class OnceFilter:
    """Copies lines to ``out``, each distinct non-blank line once."""

    def __init__(self, out, last_step: int | None = None) -> None:
        self.out = out
        self.seen: set[str] = set()
        self.muted = False  # after Ctrl-C: the ranks' and torchrun's KeyboardInterrupt tracebacks are noise
        self.last_step = last_step
        self.showing = True  # whether the last progress line was shown (its timers line follows it)
        self.error: str | None = None  # a rank's one-line "error: ..." (collector.tools.supervise)
        self.fault: tuple[int, str] | None = None  # (step, what to say once the training reaches it)

    def write_line(self, line: str) -> None:
        if self.muted:
            return
        if line.startswith("error: "):  # a user error, said once: torchrun's report of it is noise
            self.error = line.strip()
            self.muted = True
            self.out.write(line)
            self.out.flush()
            return
        if line.startswith(_PROFILER_NOISE):  # the profiler's own trace points, per capture and rank
            return
        progress = _PROGRESS.match(line)
        if progress:  # "[gpt] step N loss ...", "[engine] step=N ...": the first, every PROGRESS_EVERY-th and the last
            step = int(progress.group(1) or progress.group(2))
            if self.fault is not None and step >= self.fault[0]:
                self.out.write(f"[demo] step {step}: {self.fault[1]}\n")
                self.fault = None
            self.showing = step in (1, self.last_step) or step % PROGRESS_EVERY == 0
            if not self.showing:
                return
        elif line.startswith(_ENGINE_TIMERS) and not self.showing:
            return
        key = line.rstrip()
        if key and key in self.seen:
            return
        self.seen.add(key)
        self.out.write(line)
        self.out.flush()

    def pump(self, stream) -> None:
        for line in iter(stream.readline, ""):
            self.write_line(line)


def parse_straggler(spec: str) -> tuple[int, float, int]:
    """``RANK:MS@STEP`` (``1:40@300``) -> (rank, ms, step); trainer.examples.gpt reads the same
    spec (the collector side does not import the trainer: the demo launches it as a process)."""
    try:
        rank, rest = spec.split(":", 1)
        ms, _, step = rest.partition("@")
        return int(rank), float(ms), int(step or 0)
    except ValueError:
        raise SystemExit(f"rankscope demo: --straggler {spec!r}: expected RANK:MS@STEP, e.g. 1:40@300") from None


def _port_or_free(port: int) -> int:
    """``port`` if nothing listens there now, else a free one."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return free_port()
    return port


def _drop_spool(spool_dir: str) -> None:
    """The demo's spool dir goes when empty; with envelopes left in it, it stays and is named."""
    leftover = [name for name in os.listdir(spool_dir) if name.endswith(".rsspool")] if os.path.isdir(spool_dir) else []
    if leftover:
        print(f"[demo] {len(leftover)} spool file(s) not sent are kept in {spool_dir}", flush=True)
    else:
        shutil.rmtree(spool_dir, ignore_errors=True)


class _Stopped(Exception):
    """SIGTERM or SIGHUP (a process manager, a closed terminal): stop as on Ctrl-C."""


# The stop a signal asked for, kept past the exception that carries it: DuckDB turns a signal that
# lands inside a query into its own RuntimeError (catalog.stopped_by_signal), which a poll that
# retries on errors would swallow; SIGTERM's _Stopped as well as Ctrl-C's KeyboardInterrupt.
_stop_asked: BaseException | None = None


_starting_now = False  # a child process is being started: a stop signal waits until it is (``_starting``)
_stopping_now = False  # the demo is stopping what it started: a second stop signal changes nothing


def _now_stopping() -> None:
    global _stopping_now
    _stopping_now = True


def _stop_on(signum, _frame) -> None:
    global _stop_asked
    if _stopping_now:  # before the handlers are set to SIG_IGN (finally of run_demo), a signal lands here
        return
    _stop_asked = KeyboardInterrupt() if signum == signal.SIGINT else _Stopped(signal.Signals(signum).name)
    if not _starting_now:
        raise _stop_asked


@contextlib.contextmanager
def _starting():
    """Start a child process, a stop signal held until it is started and kept: raised inside
    subprocess's fork hooks it prints an "Exception ignored" traceback, and raised before the
    child is assigned it leaves the child behind (a collector holding the data dir). The stop is
    raised on the way out, and the finally of run_demo stops what was started."""
    global _starting_now
    _starting_now = True
    try:
        yield
    finally:
        _starting_now = False
    _stop_if_asked()


def _stop_if_asked() -> None:
    """Raise the stop a signal asked for, if one did (see _stop_asked)."""
    if _stop_asked is not None:
        raise _stop_asked


class _Terminal:
    """The terminal's foreground, taken when another program (make) started the demo in it, and
    given back on the way out: Ctrl-C then reaches the demo's process group alone (module docstring)."""

    def __init__(self) -> None:
        self.fd = self.previous = None
        try:
            fd = sys.stdin.fileno()
            if not os.isatty(fd) or os.getpgrp() == os.getpid() or os.tcgetpgrp(fd) != os.getpgrp():
                return  # not a terminal, already a group of its own (a shell's job), or in the background
            previous = os.getpgrp()
            os.setpgid(0, 0)
            self._set_foreground(fd, os.getpgrp())
            self.fd, self.previous = fd, previous
        except (OSError, ValueError):
            pass

    @staticmethod
    def _set_foreground(fd: int, pgrp: int) -> None:
        quiet = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may not set it otherwise
        try:
            os.tcsetpgrp(fd, pgrp)
        finally:
            signal.signal(signal.SIGTTOU, quiet)

    def give_back(self) -> None:
        if self.fd is not None:
            try:
                self._set_foreground(self.fd, self.previous)
            except OSError:
                pass
            self.fd = None


def _die_with_parent(nice: int = 0, sig: int = signal.SIGTERM):
    """A preexec_fn: ``nice``, and ``sig`` from the kernel when the demo goes."""

    def preexec() -> None:
        if nice:
            os.nice(nice)
        die_with_parent(sig)

    return preexec


def _rankscope() -> str:
    """How to call the CLI from here: this environment's ``rankscope``, as a path relative to the
    working directory when it is below it (``.venv/bin/rankscope``)."""
    exe = Path(sys.executable).parent / "rankscope"
    if not exe.exists():
        return "rankscope"
    rel = os.path.relpath(exe)
    return rel if not rel.startswith("..") else str(exe)


def _demo_run_id(data_dir: str, since: float, proc: subprocess.Popen, timeout_s: float = 120.0) -> str | None:
    """The id of the demo's run once its ranks said Hello (the newest run named RUN_NAME started
    after ``since``), or None if the training ended or took too long."""
    from collector.data import catalog

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        _stop_if_asked()
        try:
            con = catalog.connect(data_dir)
            try:
                row = con.execute(
                    "SELECT run_id FROM runs WHERE name = ? AND epoch(started_at::TIMESTAMPTZ) >= ? "
                    "ORDER BY started_at DESC LIMIT 1",
                    [RUN_NAME, since - 5],
                ).fetchone()
            finally:
                con.close()
            if row:
                return row[0]
        except Exception:  # the catalog not written yet, or a file compacted while read: look again
            _stop_if_asked()  # ... unless it was Ctrl-C landing in the query
        time.sleep(1.0)
    return None


def _tell_commands(run_id: str, data_dir_flag: str, suspect: int | None, nproc: int) -> None:
    cli = _rankscope()
    rank = suspect if suspect is not None else min(1, nproc - 1)
    reference = 0 if rank != 0 else 1
    print(
        f"[demo] run {run_id}; in another terminal (the collector is found from the data dir):\n"
        f"  {cli} health {run_id}{data_dir_flag}\n"
        f"  {cli} stacks {run_id} --ranks {rank}{data_dir_flag}\n"
        f"  {cli} profile {run_id} --ranks {rank} --reference {reference} --steps 3{data_dir_flag}",
        flush=True,
    )


def _watch_evidence(data_dir: str, stop: threading.Event) -> None:
    """Tell the console each time the collector's automatic evidence lands (D/artifacts/run=*/)."""
    root = Path(data_dir) / "artifacts"

    def files() -> set[Path]:
        try:
            return set(root.glob("run=*/*.json.gz"))
        except OSError:
            return set()

    seen = files()
    while not stop.wait(EVIDENCE_POLL_S):
        new = sorted(files() - seen)
        seen.update(new)
        for path in new:
            what = path.name.removesuffix(".json.gz").rsplit("-", 2)[-2:]  # rank<R>, kind
            print(
                f"[demo] evidence: {' '.join(what)} captured by the collector ({path}); "
                "Overview's evidence line links it",
                flush=True,
            )


def run_demo(args: argparse.Namespace) -> int:
    # Without these the demo would die at once and leave its collector (holding the data dir) and
    # dashboard running; with them, the finally below stops them as Ctrl-C does.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_on)
    terminal = _Terminal()
    data_dir = os.path.abspath(args.data_dir)
    data_dir_flag = "" if os.path.abspath(DEFAULT_DATA_DIR) == data_dir else f" --data-dir {args.data_dir}"
    os.makedirs(data_dir, exist_ok=True)
    collector = dashboard = train_proc = once = guard = None
    watching = threading.Event()
    spool_dir = tempfile.mkdtemp(prefix="rankscope-demo-spool-")
    steps = args.steps or UNTIL_STOPPED
    stopped_by = started = None
    try:
        try:
            # No death signal: if the demo is killed, its guard stops the collector after the training.
            # A process group of its own: Ctrl-C (SIGINT to the demo's group) must not stop it while the
            # ranks still send their last records and RunEnd; the demo stops it once the training is done.
            with _starting():
                collector = CollectorProcess(data_dir, port=args.port, auto_profile=True, preexec_fn=os.setpgrp)
        except RuntimeError as exc:
            print(
                f"[demo] the collector did not start on port {args.port}: {exc}\n"
                f"[demo] is another collector running? pick another port with --port",
                file=sys.stderr,
            )
            return 1
        endpoint = collector.address
        print(
            f"[demo] collector: {endpoint} (a port of its own, advertised in {data_dir}/collector.json; "
            "automatic evidence on)",
            flush=True,
        )
        print(f"[demo] spool dir: {spool_dir} (the ranks' own, for what the collector has not acked)", flush=True)
        if not args.no_dashboard:
            port = _port_or_free(args.dashboard_port)
            with _starting():
                dashboard = subprocess.Popen(
                    dashboard_command(data_dir, port=port),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent(),
                )
            print(f"[demo] dashboard: http://127.0.0.1:{port}", flush=True)
        extra = []
        fault = args.straggler if args.straggler and args.straggler.lower() != "none" else None
        suspect = None
        if fault:
            rank, ms, first = parse_straggler(fault)
            if rank >= args.nproc or first >= steps:
                fault = None
            else:
                extra = ["--straggler", fault]
                suspect = rank
        # Each rank under collector.tools.supervise: it stops when torchrun goes, and a stop signal
        # ends its run "stopped".
        train = torchrun_command(
            args.nproc,
            "-m",
            "collector.tools.supervise",
            "trainer.examples.gpt",
            "--config",
            args.config or EXAMPLE_CONFIG,
            "--steps",
            str(steps),
            *extra,
        )
        # The run name travels by env: torchrun would take `--run` for its own --run-path.
        env = dict(
            os.environ,
            RANKSCOPE_ENDPOINT=endpoint,
            RANKSCOPE_RUN=RUN_NAME,
            RANKSCOPE_SPOOL_DIR=spool_dir,
            OMP_NUM_THREADS="1",
        )
        length = "until Ctrl-C" if steps == UNTIL_STOPPED else f"x {steps} steps"
        print(
            f"[demo] training: {args.nproc} ranks {length}, the example GPT ({args.config or 'ZeRO-2'}), "
            "streaming into the collector",
            flush=True,
        )
        if args.training_nice:
            print(
                f"[demo] the ranks run at nice {args.training_nice}, so the dashboard stays responsive on a "
                "laptop while they train (--training-nice 0 for full priority)",
                flush=True,
            )
        if fault:
            print(
                f"[demo] staged fault: from step {first}, rank {rank} waits {ms:g} ms before each forward "
                "(a straggler); the console says when it starts, Overview's Health names it and its cost, "
                "and the collector profiles it and a reference rank on its own (an 'evidence:' line here)",
                flush=True,
            )
        started = time.time()
        # Its own session: Ctrl-C reaches the demo alone, which stops the training quietly (the
        # ranks' KeyboardInterrupt tracebacks would bury the console) and exits 0.
        with _starting():
            proc = train_proc = subprocess.Popen(
                train,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                start_new_session=True,
                # the ranks (torchrun's children) inherit the niceness: priority only, never speed the
                # run cannot use; torchrun gets SIGINT when the demo goes, and stops its ranks
                preexec_fn=_die_with_parent(args.training_nice, signal.SIGINT),
            )
        watched = [str(os.getpid()), str(proc.pid), str(collector.proc.pid), endpoint, spool_dir]
        # the guard stops the training, ends the run as the demo would, then stops the collector, if the demo is killed
        watched += [data_dir, repr(started)]
        with _starting():
            guard = subprocess.Popen([sys.executable, "-m", "collector.tools.supervise", "--guard", *watched])
        once = OnceFilter(sys.stdout, last_step=None if steps == UNTIL_STOPPED else steps)
        if fault:
            once.fault = (
                first,
                f"the staged fault is on: rank {rank} now waits {ms:g} ms before each forward; Overview's Health "
                "names it within a refresh or two, and the collector profiles it (an 'evidence:' line follows)",
            )
        pump = threading.Thread(target=once.pump, args=(proc.stdout,), daemon=True)
        pump.start()
        threading.Thread(target=_watch_evidence, args=(data_dir, watching), daemon=True).start()
        run_id = _demo_run_id(data_dir, started, proc)
        if run_id is not None:
            _tell_commands(run_id, data_dir_flag, suspect, args.nproc)
        rc = proc.wait()
        pump.join(timeout=5)
        if once.error is not None:
            print("[demo] the training did not start: fix what the line above names, then run the demo again")
            return 2
        health = f"  {_rankscope()} health {RUN_NAME}{data_dir_flag}\n" if run_id is None else ""
        print(
            f"[demo] training finished (exit {rc}); try:\n{health}"
            f"  {_rankscope()} sql{data_dir_flag} "
            f'"select op, count(*) n, round(avg(busbw_gbs), 3) busbw from comm group by op"',
            flush=True,
        )
        if args.exit or dashboard is None:
            return rc
        print("[demo] collector and dashboard keep running; Ctrl-C to stop.", flush=True)
        dashboard.wait()
        return rc
    except (KeyboardInterrupt, _Stopped) as stopped:
        _now_stopping()
        # Ctrl-C is how a person ends the demo ("Ctrl-C to stop"), SIGTERM/SIGHUP how a machine does:
        # a normal end, exit 0, so that `make demo` does not report "Error 130" for it.
        if once is not None:
            once.muted = True
        stopped_by = stopped if isinstance(stopped, _Stopped) else "Ctrl-C"
        print(f"\n[demo] stopping ({stopped_by}): the training, then the dashboard and the collector ...", flush=True)
        return 0
    finally:
        # a second Ctrl-C, SIGTERM or SIGHUP while stopping must not leave the collector or the spool
        # dir behind (nor print a traceback from the middle of this)
        _now_stopping()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        watching.set()
        ranks = children(train_proc.pid) if train_proc is not None else []
        if guard is not None:  # the demo stops everything itself
            guard.terminate()
            guard.wait()
        if train_proc is not None and train_proc.poll() is None:
            # torchrun and its ranks (sessions of their own), all gone before the collector stops
            stop_training(train_proc.pid, ranks, STOP_TRAINING_S)
            train_proc.wait()
        _stop(dashboard)
        if collector is not None:
            deliver_spooled(spool_dir, collector.address)
            if stopped_by is not None and started is not None:  # the user's stop: no run left 'running'
                ended = end_unended_runs(data_dir, collector.address, started)
                for run_id in sorted({run_id for run_id, _ in ended}):
                    ranks_left = ", ".join(str(rank) for r, rank in ended if r == run_id)
                    print(
                        f"[demo] run {run_id}: rank(s) {ranks_left} stopped before their end reached the "
                        "collector; recorded as stopped",
                        flush=True,
                    )
            collector.stop()
        _drop_spool(spool_dir)
        terminal.give_back()
        if stopped_by is not None:
            print(f"[demo] stopped ({stopped_by}); the run so far is in the data dir.", flush=True)
