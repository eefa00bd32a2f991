"""Raw bytes to an HTTP port, for what no HTTP client will send (malformed requests)."""

from __future__ import annotations

import asyncio


async def exchange(port: int, data: bytes, seconds: float = 10) -> bytes:
    """What the server on ``127.0.0.1:port`` answers to ``data``, read until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(), seconds)
    finally:
        writer.close()
