"""JIT build of the C++ extensions, cached per machine.

`load("cpu_adam")` compiles native/csrc/cpu_adam.cpp once with
torch.utils.cpp_extension (ninja) and returns the module; later processes load
the cached .so. The cache lives in $RANKSCOPE_NATIVE_BUILD_DIR or
~/.cache/rankscope/native, in a sub-directory keyed by torch version, CPU
features and build mode (the release build uses -march=native, so a cache
copied to another CPU must not be reused), and under it one folder per
extension, source path and source hash.

Switches (environment):
  RANKSCOPE_NATIVE=off  skip the build, callers use their pure-torch fallback.
  DEBUG=1               -O0 -g with asserts on, built in its own directory.

If there is no compiler or the build fails, `load` returns None after ONE
warning for the process, and callers fall back to pure torch.

`python -m native.build` builds everything and reports where and how long.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType

CSRC = Path(__file__).resolve().parent / "csrc"
EXTENSIONS = ("cpu_adam", "aio")

log = logging.getLogger(__name__)
_lock = threading.Lock()
_loaded: dict[str, ModuleType | None] = {}
_warned = False


def native_enabled() -> bool:
    """False when RANKSCOPE_NATIVE=off (or 0/false/no) forces the fallback."""
    return os.environ.get("RANKSCOPE_NATIVE", "on").strip().lower() not in {"off", "0", "false", "no"}


def debug_build() -> bool:
    return os.environ.get("DEBUG", "0").strip().lower() in {"1", "true", "yes", "on"}


def _cpu_fingerprint() -> str:
    """Hash of the CPU model and flags, so -march=native builds are per machine."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")):
                    text += line
                if line.strip() == "":
                    break  # the first processor describes them all
    except OSError:
        pass
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def build_dir() -> Path:
    import torch

    root = os.environ.get("RANKSCOPE_NATIVE_BUILD_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "rankscope", "native"
    )
    mode = "debug" if debug_build() else "release"
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{_cpu_fingerprint()}-{mode}"
    return Path(root) / tag


def _flags() -> tuple[list[str], list[str]]:
    # -fopenmp: at::parallel_for's OpenMP backend is inline in ATen's headers,
    # so without it the kernels silently run on one thread.
    if debug_build():
        # No -DNDEBUG: assert() and TORCH_INTERNAL_ASSERT_DEBUG_ONLY stay on.
        return ["-O0", "-g", "-std=c++17", "-fopenmp"], ["-g", "-fopenmp"]
    # -ffp-contract=off: no fused multiply-adds beyond the ones written out,
    # so results follow torch's rounding step by step.
    return [
        "-O3",
        "-march=native",
        "-mprefer-vector-width=512",
        "-fno-math-errno",
        "-ffp-contract=off",
        "-fopenmp",
        "-DNDEBUG",
        "-std=c++17",
    ], ["-fopenmp"]


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def load(name: str, verbose: bool = False) -> ModuleType | None:
    """The compiled extension `name`, or None (after one warning) if unavailable."""
    if name not in EXTENSIONS:
        raise ValueError(f"unknown native extension {name!r}; known: {', '.join(EXTENSIONS)}")
    if not native_enabled():
        return None
    with _lock:
        if name in _loaded:
            return _loaded[name]
        _loaded[name] = _build(name, verbose)
        return _loaded[name]


def extension_dir(name: str) -> Path:
    """Where extension ``name`` is built: one folder per source file and version, so worktrees (or
    installs) each keep their build instead of rebuilding over each other's. The path counts too:
    ninja's build file names the source by its path, so two clones of the same source sharing a
    folder rebuilt it in turn (a test collection waited 93 s for it while another clone ran)."""
    source = CSRC / f"{name}.cpp"
    key = hashlib.sha1(str(source).encode() + b"\0" + source.read_bytes()).hexdigest()[:12]
    return build_dir() / f"{name}-{key}"


# torch's build lock is a plain file that a killed build leaves behind, after which every later
# build waits on it forever. A build here takes a minute or two: a lock this old has no owner.
STALE_LOCK_S = 15 * 60


def _clear_stale_lock(lock: Path) -> None:
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        log.warning("rankscope.native: removing %s, left %.0f min ago by a build that did not finish", lock, age / 60)
        lock.unlink(missing_ok=True)


def _build(name: str, verbose: bool) -> ModuleType | None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        _warn_once(
            f"rankscope.native: no C++ compiler ({compiler!r} not on PATH); "
            "using the slower pure-torch fallback for CPUAdam and AsyncIOHandle"
        )
        return None
    try:
        from torch.utils import cpp_extension

        source = CSRC / f"{name}.cpp"
        directory = extension_dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(directory / "lock")
        cflags, ldflags = _flags()
        module_name = f"rankscope_{name}" + ("_debug" if debug_build() else "")
        return cpp_extension.load(
            name=module_name,
            sources=[str(source)],
            extra_cflags=cflags,
            extra_ldflags=ldflags,
            build_directory=str(directory),
            verbose=verbose,
        )
    except Exception as exc:  # any build/load failure means: fall back, don't crash
        _warn_once(
            f"rankscope.native: building the {name!r} extension failed ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}); using the slower "
            "pure-torch fallback. Rebuild with `python -m native.build` to see the compiler output."
        )
        return None


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m native.build", description="Build (or load the cached) rankscope C++ extensions."
    )
    parser.add_argument("--quiet", action="store_true", help="don't print compiler commands")
    args = parser.parse_args(argv)
    if not native_enabled():
        print("RANKSCOPE_NATIVE=off: nothing to build, the pure-torch fallback is in use")
        return 0
    print(f"build directory: {build_dir()} ({'debug' if debug_build() else 'release'})")
    failed = []
    for name in EXTENSIONS:
        start = time.perf_counter()
        module = load(name, verbose=not args.quiet)
        status = f"ok   {module.__file__}" if module is not None else "FAILED (fallback in use)"
        print(f"{name:9s} {status}  [{time.perf_counter() - start:.1f}s]")
        if module is None:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
