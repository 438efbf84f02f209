"""Generate the Python stubs from ``rankscope.proto`` with grpc_tools' protoc.

Run by the package build (setup.py) and by hand as ``python -m proto.generate``.
Writes to temporary names and renames, so a reader never sees a half-written stub.
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


def generate() -> None:
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - install problem
        raise SystemExit(
            "grpcio-tools is not installed: it generates the gRPC stubs (pip install grpcio-tools, or run `make`)"
        ) from exc
    import grpc_tools

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory(dir=HERE) as tmp:
        # protoc names outputs after the proto's path relative to -I, so
        # compiling proto/rankscope.proto from ROOT yields `from proto import ...`.
        rc = protoc.main(
            [
                "protoc",
                f"-I{ROOT}",
                f"-I{include}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                str(PROTO.relative_to(ROOT)),
            ]
        )
        if rc != 0:
            raise SystemExit(f"protoc failed on {PROTO} (exit {rc})")
        for out in OUTPUTS:
            os.replace(Path(tmp) / "proto" / out.name, out)


if __name__ == "__main__":
    generate()
    print("generated", ", ".join(p.name for p in OUTPUTS), file=sys.stderr)
