"""A refusal sent straight from ASGI middleware, before the app runs: a JSON body {"detail": ...} as FastAPI's."""

from __future__ import annotations

import json
from typing import Callable


async def send_detail(send: Callable, status: int, detail: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Send a JSON answer {"detail": detail} with this status and any extra headers."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *headers]})
    await send({"type": "http.response.body", "body": json.dumps({"detail": detail}).encode()})
