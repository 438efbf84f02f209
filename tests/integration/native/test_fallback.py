"""The pure-torch / pure-Python fallback paths, forced with RANKSCOPE_NATIVE=off.

Re-runs the CPUAdam and AsyncIOHandle suites in a child interpreter where the
extensions are disabled, so both backends meet the same tests; and checks that
a missing compiler gives one warning and a working fallback, not a crash.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_forced_off_selects_fallbacks_without_warning():
    result = _python(
        "import warnings; warnings.simplefilter('error')\n"
        "from native import cpu_adam, aio\n"
        "print(cpu_adam.BACKEND, aio.BACKEND)",
        RANKSCOPE_NATIVE="off",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["torch", "python"]


def test_fallback_passes_the_same_suites():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/unit/native/test_cpu_adam.py",
            "tests/unit/native/test_aio.py",
            "tests/integration/native/test_aio.py",
            "-k",
            "not 256MiB and not 1000003 and not 3145745",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RANKSCOPE_NATIVE": "off"},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


def test_missing_compiler_warns_once_and_falls_back(tmp_path):
    code = (
        "import warnings, torch\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import native\n"
        "    from native import cpu_adam, aio\n"
        "print(cpu_adam.BACKEND, aio.BACKEND, len(caught))\n"
        "print(caught[0].message if caught else '')\n"
        "p = torch.ones(3); p.grad = torch.ones(3)\n"
        "native.CPUAdam([p], lr=0.1).step(); print(bool((p < 1).all()))\n"
    )
    result = _python(code, CXX=str(tmp_path / "no-such-compiler"), RANKSCOPE_NATIVE_BUILD_DIR=str(tmp_path / "build"))
    assert result.returncode == 0, result.stderr
    backends, message, stepped = result.stdout.splitlines()
    assert backends.split() == ["torch", "python", "1"]
    assert "no C++ compiler" in message and "fallback" in message
    assert stepped == "True"


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next(tmp_path):
    """torch's build lock is a plain file; a build killed mid-way leaves it and every later build
    would wait on it forever. One older than any real build is removed with a warning."""
    import shutil

    import pytest

    from native.build import STALE_LOCK_S, extension_dir

    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler: nothing is built, so there is no build lock")
    lock = extension_dir("cpu_adam") / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    old = lock.stat().st_mtime - STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    result = _python("from native.build import load; print(load('cpu_adam') is not None)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True" and not lock.exists()
    assert "removing" in result.stderr and "did not finish" in result.stderr
