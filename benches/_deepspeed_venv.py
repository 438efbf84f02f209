"""The DeepSpeed venv the comparison benchmarks run DeepSpeed in: `.bench-venv-ds/`
(gitignored). DeepSpeed is never a dependency of rankscope; benchmarks that compare
against it call ``ensure()``, which creates the venv on first use:

    python3 -m venv .bench-venv-ds
    .bench-venv-ds/bin/pip install torch==2.13.0 deepspeed==0.19.8

DeepSpeed runs there on CPU (``DS_ACCELERATOR=cpu``) over gloo, as in
tests/fixtures/deepspeed_run/generate.py.

    python -m benches._deepspeed_venv      # create it if missing, print its versions

DeepSpeed compiles two C++ ops the first time a process of a venv uses them (its CPU Adam and its
shared-memory all_reduce: a minute or more of g++ on two cores); ``build_ops`` (run by the module,
so by ``make ds-venv``) has that done before any test needs them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = (
    ROOT / ".bench-venv-ds"
).resolve()  # a symlinked venv keeps its real path: DeepSpeed's JIT ops rebuild when it changes
PYTHON = VENV / "bin" / "python"
TORCH, DEEPSPEED = "2.13.0", "0.19.8"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"  # CPU wheels: no CUDA download


def env(**extra: str) -> dict[str, str]:
    """Environment for a process in the venv: DeepSpeed on CPU, one intra-op thread, its JIT ops built
    inside the venv (torch's default, ~/.cache/torch_extensions, is one folder per machine: two clones'
    venvs name their sources by different paths, so each rebuilt the ops the other had just built)."""
    e = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        TORCH_EXTENSIONS_DIR=str(VENV / "torch_extensions"),
    )
    e.pop("PYTHONPATH", None)  # nothing from rankscope's venv leaks in
    e.update(extra)
    return e


def versions() -> dict[str, str] | None:
    """{'torch': ..., 'deepspeed': ...} from the venv, or None if it cannot import them."""
    if not PYTHON.exists():
        return None
    code = (
        "import json, torch, deepspeed; "
        "print(json.dumps({'torch': torch.__version__, 'deepspeed': deepspeed.__version__}))"
    )
    try:
        out = subprocess.run([str(PYTHON), "-c", code], env=env(), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def _pip(args: list[str], check: bool = True) -> bool:
    print(f"[deepspeed venv] {PYTHON.name} -m pip {' '.join(args)}", flush=True)
    done = subprocess.run([str(PYTHON), "-m", "pip", *args], env=env(DS_BUILD_OPS="0"), check=check, timeout=3600)
    return done.returncode == 0


def ensure() -> Path:
    """Path of the venv's python, creating the venv (and installing torch + DeepSpeed) if needed."""
    have = versions()
    if have and have["deepspeed"] == DEEPSPEED and have["torch"].split("+")[0] == TORCH:
        return PYTHON
    if have:
        print(f"[deepspeed venv] {VENV} has {have}; installing torch=={TORCH} deepspeed=={DEEPSPEED}", flush=True)
    elif not PYTHON.exists():
        print(f"[deepspeed venv] creating {VENV} (python3 -m venv)", flush=True)
        subprocess.run(
            [sys.executable if sys.version_info >= (3, 9) else "python3", "-m", "venv", str(VENV)],
            check=True,
            timeout=600,
        )
    # torch: a CPU wheel pip already has at hand (its find-links) first, without asking any index,
    # then its dependencies from the usual index; only without such a wheel, PyTorch's CPU index.
    # So a machine that cannot reach download.pytorch.org does not spend minutes in retries first.
    _pip(["install", "--upgrade", "pip"])
    if _pip(["install", f"torch=={TORCH}", "--no-index", "--no-deps"], check=False):
        _pip(["install", f"torch=={TORCH}"])
    else:
        _pip(["install", f"torch=={TORCH}", "--index-url", TORCH_INDEX])
    _pip(["install", f"deepspeed=={DEEPSPEED}"])
    have = versions()
    if not have:
        raise RuntimeError(f"DeepSpeed venv at {VENV} still cannot import torch and deepspeed")
    print(f"[deepspeed venv] ready: {have}", flush=True)
    return PYTHON


JIT_OPS = ("FusedAdamBuilder", "ShareMemCommBuilder")


# What a rankscope rank needs beyond torch, numpy and psutil (which the venv has already), for a
# DeepSpeed script in the venv with collector.hook attached: installed with the venv's pip into a
# folder of its own (so the venv stays DeepSpeed's alone), put on PYTHONPATH with the repo.
RANK_SIDE = ROOT / ".bench-venv-ds-rankscope"
RANK_SIDE_PACKAGES = ("grpcio", "protobuf", "pyarrow")


def ensure_rank_side() -> dict[str, str]:
    """``env()`` for running a hooked script in the venv: DeepSpeed on CPU, and this repo plus its
    rank-side packages (pinned by constraints.txt) importable. Installs the packages on first use."""
    python = ensure()
    marker = RANK_SIDE / ".installed"
    if not marker.exists():
        print(f"[deepspeed venv] installing {', '.join(RANK_SIDE_PACKAGES)} into {RANK_SIDE}", flush=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--target",
                str(RANK_SIDE),
                "-c",
                str(ROOT / "constraints.txt"),
                *RANK_SIDE_PACKAGES,
            ],
            env=env(),
            check=True,
            timeout=1800,
        )
        marker.touch()
    return env(PYTHONPATH=f"{ROOT}{os.pathsep}{RANK_SIDE}")


# DeepSpeed's tensorboard monitor imports torch.utils.tensorboard, which needs the tensorboard package
# that DeepSpeed does not install: its own folder (the venv stays DeepSpeed's alone), with only the
# packages the venv lacks (--no-deps: numpy and setuptools stay the venv's), pinned by constraints.txt.
TENSORBOARD_SIDE = ROOT / ".bench-venv-ds-tensorboard"
TENSORBOARD_PACKAGES = (
    "tensorboard",
    "tensorboard-data-server",
    "absl-py",
    "markdown",
    "werkzeug",
    "grpcio",
    "protobuf",
    "pillow",
)


def ensure_tensorboard() -> dict[str, str]:
    """``env()`` for a DeepSpeed script whose config enables the tensorboard monitor (installs on first use)."""
    python = ensure()
    marker = TENSORBOARD_SIDE / ".installed"
    if not marker.exists():
        print(f"[deepspeed venv] installing {', '.join(TENSORBOARD_PACKAGES)} into {TENSORBOARD_SIDE}", flush=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(TENSORBOARD_SIDE)]
        subprocess.run(
            [*pip, "-c", str(ROOT / "constraints.txt"), *TENSORBOARD_PACKAGES],
            env=env(),
            check=True,
            timeout=1800,
        )
        marker.touch()
    return env(PYTHONPATH=str(TENSORBOARD_SIDE))


def build_ops() -> None:
    """Compiles DeepSpeed's JIT ops (``JIT_OPS``) in the venv now, at this process's priority; ops
    already built just load. ``make ds-venv`` (a set-up step of ``make test``) calls it, so no test
    waits on a compiler, whichever pytest-xdist worker starts it first."""
    code = (
        f"from deepspeed.ops.op_builder.cpu import {', '.join(JIT_OPS)}\n"
        f"for builder in ({', '.join(JIT_OPS)}):\n"
        "    builder().load()\n"
    )
    print(f"[deepspeed venv] building its JIT ops ({', '.join(JIT_OPS)})", flush=True)
    subprocess.run([str(PYTHON), "-c", code], env=env(MAX_JOBS="2"), check=True, timeout=3600)


if __name__ == "__main__":
    ensure()
    ensure_tensorboard()
    build_ops()
    print(versions())
