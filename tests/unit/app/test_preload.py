"""app.preload: the page shell imports Streamlit's Plotly chunk as it loads (issue 48), through an ASGI
middleware driven here in-process over Streamlit's own index.html."""

import asyncio
from pathlib import Path

import streamlit as st

from app.preload import PlotlyEarly, plotly_chunk, shell_tag

STATIC = Path(st.__file__).parent / "static"
INDEX = (STATIC / "index.html").read_bytes()


def _serve(content_type: bytes, chunks: list[bytes], seen: dict):
    """An ASGI app answering every request with ``chunks`` (as Streamlit's static handler does: a
    content-length, an etag), noting the request's headers in ``seen``."""

    async def app(scope, receive, send):
        seen["headers"] = dict(scope["headers"])
        headers = [
            (b"content-type", content_type),
            (b"content-length", str(sum(map(len, chunks))).encode()),
            (b"etag", b'"53c5e67b"'),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i, chunk in enumerate(chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(chunks) - 1})

    return app


def _get(app, path: str) -> tuple[dict, bytes]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": [(b"accept-encoding", b"gzip, br")]}
    asyncio.run(PlotlyEarly(app)(scope, receive, send))
    return sent[0], b"".join(m.get("body", b"") for m in sent[1:])


def test_the_chunk_it_names_is_streamlits_plotly_chunk():
    assert plotly_chunk() is not None and (STATIC / "static" / "js" / plotly_chunk()).is_file()
    assert f'import("./static/js/{plotly_chunk()}")'.encode() in shell_tag()


def test_every_page_gets_the_import_once_before_head_ends_uncompressed():
    seen: dict = {}
    start, body = _get(_serve(b"text/html; charset=utf-8", [INDEX[:1000], INDEX[1000:]], seen), "/comms")
    assert b"accept-encoding" not in seen["headers"]  # asked uncompressed, so the tag can go in
    assert body == INDEX.replace(b"</head>", shell_tag() + b"</head>", 1)
    assert body.count(shell_tag()) == 1 and body.index(shell_tag()) < body.index(b"</head>")
    headers = dict(start["headers"])
    assert headers[b"content-length"] == str(len(body)).encode()
    assert b"etag" not in headers  # the etag named the page without the tag


def test_scripts_and_everything_else_pass_through_untouched():
    chunks = [b"export const a = 1;", b"</head>"]
    start, body = _get(_serve(b"text/javascript", chunks, {}), "/static/js/x.js")
    assert body == b"".join(chunks)
    assert dict(start["headers"])[b"content-length"] == str(len(body)).encode()
