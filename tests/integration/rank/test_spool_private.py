"""The spool dir is private to its user (issue 49): two real uids on one host.

The victim is this test's user (root in CI); the other local user is made with ``useradd`` once and
its processes run with ``subprocess(user=...)``. The other user can neither read, list, delete nor
plant the victim's spool files; a spool dir that the other user made first (the default name in a
shared temp dir), or a symlink in its place, is refused with a message naming it and
RANKSCOPE_SPOOL_DIR, and the victim's training still exits 0. A spool file is resent only to the
endpoint it names; a collector started with --no-resends refuses resends and the files stay; a
collector that takes them says so in its log, and ``rankscope health`` says so beside the run.
"""

from __future__ import annotations

import argparse
import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from collector.rank import spool
from collector.rank.client import resend_spooled
from collector.server.limits import StreamLimits
from collector.testing.collectors import live_collector
from tests.integration.rank.test_spool_resend import _dead_pid, _envelopes, _steps

OTHER = "rankscope-other"


@pytest.fixture(scope="session")
def other_user() -> str:
    """A second local user (created once; it stays, it owns nothing but what the tests clean up)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second local user and act as it")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed")
    try:
        pwd.getpwnam(OTHER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER], check=True)
    return OTHER


@pytest.fixture
def shared_tmp():
    """A sticky, world-writable dir like /tmp (pytest's tmp_path is private to its user)."""
    path = Path(tempfile.mkdtemp(prefix="rankscope-shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_user(user: str, code: str) -> subprocess.CompletedProcess:
    """``code`` run by a Python of ``user`` (uid and gid), printing what it could do."""
    entry = pwd.getpwnam(user)
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
    if python is None:  # the venv's may sit under a home the other user cannot enter
        pytest.skip("no system python3 for the other user")
    return subprocess.run(
        [python, "-I", "-c", textwrap.dedent(code)],
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )


def _default_dir(shared: Path, monkeypatch) -> Path:
    monkeypatch.delenv("RANKSCOPE_SPOOL_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    return spool.default_dir()


def test_the_other_user_can_neither_read_list_delete_nor_plant_spool_files(other_user, shared_tmp, monkeypatch):
    directory = _default_dir(shared_tmp, monkeypatch)
    assert directory.parent == shared_tmp
    path = spool.write(directory, f"{spool.local_host_id()}.{_dead_pid()}.x", _envelopes("c", "secret", 1), "e:1")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    tried = as_user(
        other_user,
        f"""
        import os
        d, f = {str(directory)!r}, {str(path)!r}
        for what, act in [("list", lambda: os.listdir(d)), ("read", lambda: open(f, "rb").read()),
                          ("delete", lambda: os.unlink(f)), ("plant", lambda: open(d + "/x-1-1.rsspool", "wb")),
                          ("rename", lambda: os.rename(d, d + ".gone"))]:
            try:
                act()
                print(what, "allowed")
            except PermissionError:
                print(what, "refused")
        """,
    )
    assert tried.returncode == 0, tried.stderr
    assert tried.stdout.split("\n")[:5] == [f"{w} refused" for w in ("list", "read", "delete", "plant", "rename")]
    assert path.exists() and [p.name for p in directory.iterdir()] == [path.name]


@pytest.mark.parametrize("planted", ["directory", "symlink"])
def test_a_spool_dir_the_other_user_made_first_is_refused_and_training_goes_on(
    other_user, shared_tmp, monkeypatch, tmp_path, planted
):
    directory = _default_dir(shared_tmp, monkeypatch)
    trap = shared_tmp / "trap"
    made = as_user(
        other_user,
        f"""
        import os
        os.mkdir({str(trap)!r}, 0o777)
        os.chmod({str(trap)!r}, 0o777)
        if {planted!r} == "directory":
            os.mkdir({str(directory)!r}, 0o777)
            os.chmod({str(directory)!r}, 0o777)
        else:
            os.symlink({str(trap)!r}, {str(directory)!r})
        """,
    )
    assert made.returncode == 0, made.stderr
    with pytest.raises(spool.UnsafeSpoolDir) as refused:
        spool.write(directory, "c", _envelopes("c", "r", 1), "e:1")
    assert str(directory) in str(refused.value) and "RANKSCOPE_SPOOL_DIR" in str(refused.value)
    assert ("symbolic link" if planted == "symlink" else f"belongs to {other_user}") in str(refused.value)

    # a real rank with its collector down: spooling is refused, training finishes, nothing lands there
    script = textwrap.dedent("""
        import sys
        from collector import hook
        from collector.rank import session
        active = hook.attach(run="victim", endpoint=sys.argv[1])
        active.client.cfg.close_timeout_s = 0.5
        for step in range(50):
            session.emit("timers", step=step, name="fwd", start_ns=step, dur_ns=1000)
        hook.detach()
        print("trained")
    """)
    env = {k: v for k, v in os.environ.items() if k != "RANKSCOPE_SPOOL_DIR"}
    env.update(TMPDIR=str(shared_tmp), WORLD_SIZE="1", OMP_NUM_THREADS="1")
    from collector.testing.ports import free_port

    rank = subprocess.run(
        [sys.executable, "-c", script, f"127.0.0.1:{free_port()}"],
        env=env,
        cwd=os.getcwd(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rank.returncode == 0 and "trained" in rank.stdout, rank.stderr
    said = [line for line in rank.stderr.splitlines() if "cannot spool" in line]
    assert len(said) == 1 and str(directory) in said[0] and "RANKSCOPE_SPOOL_DIR" in said[0], rank.stderr
    assert "Traceback" not in rank.stderr, rank.stderr
    assert not any(trap.iterdir()) and (planted == "symlink" or not any(directory.iterdir()))


def test_an_old_open_spool_dir_of_ours_is_made_private(tmp_path):
    old = tmp_path / "spool"
    old.mkdir(mode=0o755)
    old.chmod(0o755)
    spool.write(old, "c", _envelopes("c", "r", 1), "e:1")
    assert stat.S_IMODE(old.stat().st_mode) == 0o700


def test_only_our_own_files_for_this_endpoint_are_resent(other_user, tmp_path):
    directory = tmp_path / "spool"
    ours = spool.write(directory, f"{spool.local_host_id()}.{_dead_pid()}.a", _envelopes("a", "ours", 1), "e:1")
    elsewhere = spool.write(directory, f"{spool.local_host_id()}.{_dead_pid()}.b", _envelopes("b", "x", 1), "e:2")
    planted = spool.write(directory, f"{spool.local_host_id()}.{_dead_pid()}.c", _envelopes("c", "y", 1), "e:1")
    os.chown(planted, pwd.getpwnam(other_user).pw_uid, -1)  # as if another user had put it there
    old = directory / f"{spool.local_host_id()}.{_dead_pid()}.d-000000000001-000000000001.rsspool"
    data = _envelopes("d", "z", 0)[0].SerializeToString()
    old.write_bytes(b"RSSPOOL1" + len(data).to_bytes(4, "little") + data)  # names no endpoint
    found = [p for paths in spool.orphans(directory, "e:1").values() for p in paths]
    assert found == [ours]
    assert [p for paths in spool.orphans(directory, "e:2").values() for p in paths] == [elsewhere]


def test_no_resends_keeps_the_files_and_a_collector_that_takes_them_says_so(tmp_path, caplog):
    directory = tmp_path / "spool"
    cid = f"{spool.local_host_id()}.{_dead_pid()}.old"
    with live_collector(tmp_path / "data", stream_limits=StreamLimits(resends=False)) as c:
        path = spool.write(directory, cid, _envelopes(cid, "earlier", 3), c.endpoint)
        with caplog.at_level(logging.WARNING, logger="rankscope.client"):
            assert resend_spooled(directory, c.endpoint) == (0, 1)
    assert path.exists(), "a collector with --no-resends leaves the files in the spool"
    refused = [r.getMessage() for r in caplog.records if "takes no resends" in r.getMessage()]
    assert len(refused) == 1 and "--no-resends" in refused[0], [r.getMessage() for r in caplog.records]
    assert "earlier" not in _steps(tmp_path / "data")

    caplog.clear()
    with live_collector(tmp_path / "data", port=c.port) as c2:
        with caplog.at_level(logging.WARNING, logger="rankscope.collector"):
            assert resend_spooled(directory, c2.endpoint) == (1, 0)
    said = [r.getMessage() for r in caplog.records if r.name == "rankscope.collector"]
    assert said and "resent 30 records of 1 earlier run spooled for this endpoint" in said[-1], said
    assert len(_steps(tmp_path / "data")["earlier"]) == 30

    from collector.tools.health import main

    args = argparse.Namespace(data_dir=str(tmp_path / "data"), run="earlier", json=False, all=False)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(args)
    assert "30 records of this run reached the collector from spool files resent" in out.getvalue(), out.getvalue()
