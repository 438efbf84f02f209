"""What a newcomer sees: `rankscope demo`'s console for a short run (no dashboard), read
as a person would: where the collector is, the training's progress, no traceback, no
library deprecation warnings, nothing printed once per rank; and the run is in the data."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from collector.data import catalog
from collector.rank.spool import client_id_of
from tests.integration._demo import start_demo


def test_the_demo_console_is_short_and_clean(tmp_path):
    data = tmp_path / "data"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "collector.tools.cli",
            "demo",
            "--data-dir",
            str(data),
            "--nproc",
            "4",
            "--steps",
            "12",
            "--no-dashboard",
            "--exit",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    console = out.stdout + out.stderr
    assert out.returncode == 0, console
    assert "[demo] collector: 127.0.0.1:" in console
    assert "Traceback" not in console and "FutureWarning" not in console and "DeprecationWarning" not in console
    repeated = [line for line, n in collections.Counter(console.splitlines()).items() if line.strip() and n >= 2]
    assert repeated == [], repeated
    assert "step 12 loss" in console
    con = catalog.connect(data)
    try:
        name, status, world = con.execute("SELECT name, status, world_size FROM runs").fetchone()
        comm = con.execute("SELECT count(*) FROM comm").fetchone()[0]
    finally:
        con.close()
    assert (name, status, world) == ("demo", "finished", 4) and comm > 0


def test_ctrl_c_ends_the_demo_cleanly_with_exit_0(tmp_path):
    """Ctrl-C is how a person stops the demo: the terminal sends SIGINT to the foreground process
    group, here the demo's own. Exit 0 (so `make demo` reports no "Error 130"), a line saying so,
    no traceback of the demo's or of the training ranks'."""
    proc = start_demo(
        tmp_path / "data", "--nproc", "2", "--steps", "100000", "--no-dashboard", "--port", "0", cwd=tmp_path
    )
    console = []
    try:
        for line in proc.stdout:  # training under way: its first step is printed
            console.append(line)
            if "step 1 loss" in line:
                break
        # the ranks yield the CPU to the dashboard (nice +10); the collector keeps the demo's priority
        niceness = {cmd: nice for pid, cmd, nice in _descendants(proc.pid)}
        ranks = [n for cmd, n in niceness.items() if "trainer.examples.gpt" in cmd]
        collectors = [n for cmd, n in niceness.items() if " collect " in f" {cmd} "]
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert ranks and collectors, niceness
        assert set(ranks) == {min(base + 10, 19)} and set(collectors) == {base}, niceness
        # Ctrl-C reaches the demo's group; the collector, in a group of its own, stays up until the
        # ranks' last records and RunEnd are in (in the demo's group it stopped at once, and a rank's
        # RunEnd could find it gone: a CI run left a spool dir so)
        groups = {cmd: os.getpgid(pid) for pid, cmd, _ in _descendants(proc.pid) if " collect " in f" {cmd} "}
        assert groups and proc.pid not in groups.values(), groups
        os.killpg(proc.pid, signal.SIGINT)
        console.append(proc.stdout.read())
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = "".join(console)
    assert rc == 0, text
    assert "[demo] stopped (Ctrl-C)" in text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    spool = re.search(r"\[demo\] spool dir: (\S+)", text)
    assert spool and not os.path.exists(spool[1]), _left_behind(spool and spool[1], text)
    assert not (tmp_path / "data" / "collector.json").exists(), "the demo's collector did not withdraw its endpoint"
    _assert_stopped(tmp_path / "data", "ranks")


def test_sigterm_ends_the_demo_and_everything_it_started(tmp_path):
    """A process manager's SIGTERM (or a closed terminal's SIGHUP) to the demo alone: it stops its
    training, collector and dashboard as Ctrl-C does (before, the demo died at once and left its
    collector holding the data dir and its dashboard serving), and says so; a second SIGTERM while it
    stops changes nothing (before: a traceback from the middle of the cleanup)."""
    proc = start_demo(tmp_path / "data", "--nproc", "2", "--steps", "100000", "--port", "0", cwd=tmp_path)
    console, started = [], []
    try:
        for line in proc.stdout:
            console.append(line)
            if "step 1 loss" in line:
                break
        started = _descendants(proc.pid)
        assert any(" collect " in f" {cmd} " for _, cmd, _ in started), started
        assert any("streamlit" in cmd for _, cmd, _ in started), started
        proc.send_signal(signal.SIGTERM)  # the demo's pid only, not its group
        for line in proc.stdout:
            console.append(line)
            if "[demo] stopping" in line:
                proc.send_signal(signal.SIGTERM)  # an impatient process manager: a second one while it stops
                break
        console.append(proc.stdout.read())
        rc = proc.wait(timeout=60)
        left = [cmd for pid, cmd, _ in started if _alive(pid)]
    finally:
        for pid in [proc.pid] + [pid for pid, _, _ in started]:  # nothing outlives the test, pass or fail
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    text = "".join(console)
    assert rc == 0, text
    assert "[demo] stopped (SIGTERM)" in text and "Traceback" not in text, text
    assert left == [], left


def _left_behind(spool_dir: str | None, console: str) -> str:
    """What a spool dir the demo left holds, and whether each file's writer (its client id is
    host.pid.nonce) still runs, with the demo's console: enough to tell a late writer from a
    resend that failed."""
    if not spool_dir:
        return f"the demo named no spool dir; its console:\n{console[-3000:]}"
    lines = [f"the spool dir is left behind: {spool_dir}"]
    for name in sorted(os.listdir(spool_dir)):
        pid = ([*client_id_of(Path(name)).rsplit(".", 2), ""])[1]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                writer = "running: " + f.read().replace(b"\0", b" ").decode(errors="replace")[:150]
        except (OSError, ValueError):
            writer = "gone"
        age = time.time() - os.path.getmtime(os.path.join(spool_dir, name))
        lines.append(f"  {name} (written {age:.1f} s ago; writer pid {pid or '?'} {writer})")
    return "\n".join(lines) + f"\nthe demo's console (last 3,000 characters):\n{console[-3000:]}"


def _assert_stopped(data_dir: Path, ranks_view: str) -> None:
    """The demo's one run reads 'stopped' (a run its user stopped); ``ranks_view``'s rows say why not."""
    con = catalog.connect(data_dir)
    try:
        ended = con.execute("SELECT status FROM runs").fetchall()
        ranks = con.execute(f"SELECT rank, status FROM {ranks_view} ORDER BY rank").fetchall()
    finally:
        con.close()
    assert ended == [("stopped",)], f"a run its user stopped must read 'stopped': {ended}, ranks {ranks}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _descendants(root: int) -> list[tuple[int, str, int]]:
    """(pid, command line, nice) of every live process under ``root``, from /proc."""
    parent, nice, cmd = {}, {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # exited meanwhile
            continue
        parent[int(entry)], nice[int(entry)] = int(fields[1]), int(fields[16])
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in (c for c, p in parent.items() if p == pid):
            out.append((child, cmd[child], nice[child]))
            todo.append(child)
    return out


def test_the_demo_killed_takes_everything_it_started_with_it(tmp_path):
    """The demo's parent gone and the demo with it (SIGKILL: no handler runs): the kernel's death
    signals stop its dashboard and torchrun, torchrun's going stops each rank, and the demo's guard
    then stops the collector and removes the spool dir (before, the 4 ranks trained on for minutes,
    spooling into /tmp, and the run read "ranks stopped without ending the run")."""
    proc = start_demo(tmp_path / "data", "--nproc", "2", "--steps", "100000", "--port", "0", cwd=tmp_path)
    started, console = [], []
    try:
        for line in proc.stdout:
            console.append(line)
            if "step 1 loss" in line:
                break
        started = _descendants(proc.pid)
        assert any("collector.tools.supervise" in cmd for _, cmd, _ in started), started
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        left = _wait_all_gone([pid for pid, _, _ in started], timeout_s=150)
        assert left == [], f"still running 150 s after the demo was killed: {[c for p, c, _ in started if p in left]}"
    finally:
        for pid in [pid for pid, _, _ in started]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    spool = re.search(r"\[demo\] spool dir: (\S+)", "".join(console))
    assert spool and not os.path.exists(spool[1]), _left_behind(spool and spool[1], "".join(console))
    # a rank killed before its RunEnd reached the collector (at load ~30: 3 of 6 runs) has it sent by
    # the guard (collector.tools.supervise.end_unended_runs): the run its user stopped reads 'stopped'
    _assert_stopped(tmp_path / "data", "rank_ends")


def test_ctrl_c_in_make_demo_exits_0(tmp_path):
    """`make demo`, Ctrl-C typed in its terminal (a pty here: the line discipline sends SIGINT to the
    terminal's foreground process group). The demo takes that foreground from make, so make is not
    interrupted and ends with the demo's exit 0, not "Error 130"."""
    import pty

    (tmp_path / "Makefile").write_text(
        f"demo:\n\t{sys.executable} -m collector.tools.cli demo --data-dir data --nproc 2 --steps 100000 "
        "--no-dashboard --port 0\n"
    )
    pid, fd = pty.fork()
    if pid == 0:  # the child: make, the session leader on the pty, as in a terminal
        os.chdir(tmp_path)
        os.execvp("make", ["make", "-s", "demo"])
    seen = b""
    try:
        while b"step 1 loss" not in seen:
            chunk = _read(fd)
            assert chunk, f"make demo ended before training: {seen.decode(errors='replace')}"
            seen += chunk
        os.write(fd, b"\x03")  # Ctrl-C
        while chunk := _read(fd):
            seen += chunk
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, f"make demo ended {os.waitstatus_to_exitcode(status)}: {text}"
    assert "[demo] stopped (Ctrl-C)" in text and "Error" not in text, text


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: every process holding the pty's other end has exited
        return b""


def _wait_all_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [pid for pid in pids if _alive(pid)]
        if not left:
            return []
        time.sleep(0.5)
    return [pid for pid in pids if _alive(pid)]


def test_a_bad_config_value_is_one_line_naming_the_key_and_exit_2(tmp_path):
    """ZeRO stage 4: the key, what is allowed and what was given, in one line; no torchrun traceback
    (it was 110 lines), exit 2."""
    from trainer.examples import gpt

    config = json.loads((Path(gpt.__file__).parent / "configs" / "zero2.json").read_text())
    config["zero_optimization"]["stage"] = 4
    (tmp_path / "bad.json").write_text(json.dumps(config))
    flags = ["--nproc", "2", "--steps", "5", "--no-dashboard", "--port", "0", "--config", str(tmp_path / "bad.json")]
    out = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "demo", "--data-dir", str(tmp_path / "data"), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    console = out.stdout + out.stderr
    assert out.returncode == 2, console
    assert "error: zero_optimization.stage: must be one of 0, 1, 2, 3 (got 4)" in console, console
    assert "Traceback" not in console and len(console.splitlines()) < 12, console
