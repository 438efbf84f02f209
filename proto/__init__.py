"""The wire schema (``rankscope.proto``) and its generated Python stubs.

The stubs are build output: installing the package generates them (setup.py runs
proto/generate.py with grpcio-tools, a build requirement), and so does
``python -m proto.generate`` in a bare checkout. Importing this package never
runs protoc.
"""

try:
    from proto import rankscope_pb2 as pb
    from proto import rankscope_pb2_grpc as pb_grpc
except ImportError as exc:  # a checkout that was never built
    raise ImportError(
        "rankscope's gRPC stubs are missing: install the package (pip install -e .) or run "
        "`python -m proto.generate` (needs grpcio-tools)"
    ) from exc

SCHEMA_VERSION = pb.SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "pb", "pb_grpc"]
