"""The dashboard's page shell asks for Streamlit's Plotly chunk as it loads, not when a chart arrives.

Streamlit's frontend fetches, compiles and runs its 4.7 MB Plotly chunk only once the first chart
element reaches it. On a first open beside the demo (issue 48) the browser's main thread sat idle
while the server ran the page (3.5 s of a 12.7 s cold Overview open, V8 profile), then spent most
of what was left on that chunk (5.8 s) after the first chart had arrived. Importing the chunk from
the page shell overlaps the two: the frontend's own import of the same URL later is the same module,
already loaded. The tag goes into every HTML response the server sends (Streamlit serves one
``index.html`` for every page path) through an ASGI middleware on the app ``serve.py`` declares.
"""

from __future__ import annotations

import functools
from pathlib import Path

import streamlit as st


@functools.cache
def plotly_chunk() -> str | None:
    """The file name of Streamlit's Plotly chunk (its name carries a build hash), None if not found."""
    found = sorted((Path(st.__file__).parent / "static" / "static" / "js").glob("PlotlyChart.*.js"))
    return found[0].name if found else None


@functools.cache
def shell_tag() -> bytes:
    """What goes before ``</head>``: a module script importing the chunk (relative to the page, as
    Streamlit's index.html names its own chunks, so a --server.baseUrlPath holds), or nothing."""
    name = plotly_chunk()
    if name is None:  # a Streamlit build that names it otherwise: the chunk loads as it always did
        return b""
    return f'<script type="module">import("./static/js/{name}").catch(() => {{}})</script>'.encode()


class PlotlyEarly:
    """ASGI middleware: HTML responses get ``shell_tag()`` before ``</head>``; everything else (the
    websocket, the static chunks, health checks) passes through untouched."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or not shell_tag():
            await self.app(scope, receive, send)
            return
        # the page uncompressed, so the tag can go in (8 kB; Streamlit sends its static chunks uncompressed anyway)
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"accept-encoding"]
        start: dict = {}
        body: list[bytes] = []

        async def edit(message) -> None:
            if message["type"] == "http.response.start":
                if dict(message["headers"]).get(b"content-type", b"").startswith(b"text/html"):
                    start.update(message)  # held until the body is complete
                    return
            elif message["type"] == "http.response.body" and start:
                body.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                page = b"".join(body).replace(b"</head>", shell_tag() + b"</head>", 1)
                kept = [(k, v) for k, v in start["headers"] if k.lower() not in (b"content-length", b"etag")]
                await send({**start, "headers": [*kept, (b"content-length", str(len(page)).encode())]})
                await send({"type": "http.response.body", "body": page})
                return
            await send(message)

        await self.app({**scope, "headers": headers}, receive, edit)
