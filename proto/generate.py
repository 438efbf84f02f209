"""Generate the Python stubs from ``rankscope.proto`` with grpc_tools' protoc.

Run as ``python -m proto.generate``. Writes to temporary names and renames, so
several processes importing ``proto`` at once in a fresh checkout never see a
half-written stub.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROTO = HERE / "rankscope.proto"
OUTPUTS = (HERE / "rankscope_pb2.py", HERE / "rankscope_pb2_grpc.py", HERE / "rankscope_pb2.pyi")


def stubs_current() -> bool:
    src = PROTO.stat().st_mtime
    return all(p.exists() and p.stat().st_mtime >= src for p in OUTPUTS)


def generate() -> None:
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - install problem
        raise SystemExit("grpcio-tools is not installed; run `make` to set up the venv") from exc
    import grpc_tools

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory(dir=HERE) as tmp:
        # protoc names outputs after the proto's path relative to -I, so
        # compiling proto/rankscope.proto from ROOT yields `from proto import ...`.
        rc = protoc.main([
            "protoc", f"-I{ROOT}", f"-I{include}",
            f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}",
            str(PROTO.relative_to(ROOT)),
        ])
        if rc != 0:
            raise SystemExit(f"protoc failed on {PROTO} (exit {rc})")
        for out in OUTPUTS:
            os.replace(Path(tmp) / "proto" / out.name, out)


def ensure_stubs() -> None:
    if not stubs_current():
        generate()


if __name__ == "__main__":
    generate()
    print("generated", ", ".join(p.name for p in OUTPUTS), file=sys.stderr)
