"""Bearer-token access to the collector's RPCs: every call must carry
``authorization: Bearer <token>``; any other is refused with UNAUTHENTICATED before a byte of
its request is read or decoded (the policy: collector.data.security)."""

from __future__ import annotations

import hmac

import grpc


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        sent = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(sent.encode() if isinstance(sent, str) else sent, self._expected):
            return handler
        return _refusing_handler(handler)


async def _refuse(request_or_iterator, context):
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED,
        "missing or wrong bearer token: send metadata 'authorization: Bearer <token>' (RANKSCOPE_TOKEN)",
    )


def _refusing_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that aborts before reading anything."""
    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kind[(handler.request_streaming, handler.response_streaming)]
    # No request deserializer: an unauthenticated request is never decoded.
    return make(_refuse, request_deserializer=None, response_serializer=handler.response_serializer)
