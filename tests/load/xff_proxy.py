"""A visitor's own front door for the load bench: a loopback proxy that adds X-Forwarded-For.

Chromium does not send Playwright's ``extra_http_headers`` with a WebSocket handshake, and a
Streamlit session is that handshake: every bench visitor looked the same to the server (no address,
each tab its own queue lane), so the fair-queue case measured nothing. ``forwarding(port, addr)``
starts, in a daemon thread, a TCP proxy to ``127.0.0.1:port`` that writes ``X-Forwarded-For: addr``
into the first request of each connection (a WebSocket's only one) and then copies bytes both
ways; it returns the proxy's port. The server trusts 127.0.0.1 as a proxy (Uvicorn's default and
``REMAT_LAB_TRUSTED_PROXIES``), so the session's visitor is ``addr``.
"""

from __future__ import annotations

import asyncio
import threading

_LOOP: asyncio.AbstractEventLoop | None = None
_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    with _LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, daemon=True, name="xff-proxy").start()
        return _LOOP


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _serve(port: int, addr: str) -> int:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            head = await client_r.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            client_w.close()
            return
        line, _, rest = head.partition(b"\r\n")
        head = line + b"\r\nX-Forwarded-For: " + addr.encode() + b"\r\n" + rest
        up_r, up_w = await asyncio.open_connection("127.0.0.1", port)
        up_w.write(head)
        await up_w.drain()
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server.sockets[0].getsockname()[1]


def forwarding(port: int, addr: str) -> int:
    """A proxy to the server on ``port`` whose requests come from ``addr``; the proxy's port."""
    return asyncio.run_coroutine_threadsafe(_serve(port, addr), _loop()).result(timeout=10)
