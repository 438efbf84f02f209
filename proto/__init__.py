"""The wire schema (``rankscope.proto``) and its generated Python stubs.

The stubs are build output: ``python -m proto.generate`` (run by ``make``)
writes them next to the .proto file. Importing this package generates them on
the spot when they are missing or older than the .proto, so a fresh checkout
works without a separate step.
"""
from proto.generate import ensure_stubs

ensure_stubs()

from proto import rankscope_pb2 as pb  # noqa: E402
from proto import rankscope_pb2_grpc as pb_grpc  # noqa: E402

SCHEMA_VERSION = pb.SCHEMA_VERSION

__all__ = ["pb", "pb_grpc", "SCHEMA_VERSION"]
