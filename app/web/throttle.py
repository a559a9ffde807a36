"""Login throttling: after a few failed logins from one client address, its next attempts wait out a growing pause.

A login is a POST to the page's login route, or a JSON API request (under /api/) that carries an
Authorization header: both count against the same address. Only a failed login (401, or the page's
400/401/403) counts, and only a successful one (2xx) clears the count: an answer that says nothing
about the credentials (a 404 for an unknown route, a 422 for a bad id) leaves the count as it was."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from metricsearch.app.web.json_answer import send_detail

#: failed logins from one address before its attempts are refused for a while
LOGIN_FAILURES = 5
#: the first pause after that many failures, in seconds; each further failure doubles it (at most MAX_PAUSE)
LOGIN_PAUSE = 1.0
MAX_PAUSE = 300.0


class LoginThrottle:
    """ASGI middleware: a login (POST to a login route, or an /api/ request with credentials) from an address
    with `failures` failed logins since its last success is answered 429 until `pause` * 2**(extra failures)
    seconds have passed since its last failure; only a successful login clears the address's count."""

    def __init__(self, app: Callable, failures: int = LOGIN_FAILURES, pause: float = LOGIN_PAUSE) -> None:
        self.app, self.failures, self.pause = app, failures, pause
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int, float]] = {}  # address -> (failures in a row, time of the last)

    def wait(self, address: str) -> float:
        """Seconds that `address` must still wait before its next login attempt (0: it may try now)."""
        with self._lock:
            count, last = self._seen.get(address, (0, 0.0))
        if count < self.failures:
            return 0.0
        return max(0.0, last + min(MAX_PAUSE, self.pause * 2 ** (count - self.failures)) - time.monotonic())

    def _record(self, address: str, ok: bool) -> None:
        with self._lock:
            if ok:
                self._seen.pop(address, None)
            else:
                self._seen[address] = (self._seen.get(address, (0, 0.0))[0] + 1, time.monotonic())

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        path = scope.get("path", "").rstrip("/")
        api = path.startswith("/api/") and any(name == b"authorization" for name, _ in scope.get("headers", ()))
        if scope["type"] != "http" or not (api or (scope.get("method") == "POST" and path.endswith("/login"))):
            return await self.app(scope, receive, send)
        # a page login fails with 400/401/403; an API request fails with 401; either succeeds with a 2xx
        failed = (401,) if api else (400, 401, 403)
        address = (scope.get("client") or ("?", 0))[0]
        wait = self.wait(address)
        if wait > 0:
            return await send_detail(send, 429, f"Too many failed logins: try again in {wait:.0f} s.",
                                     ((b"retry-after", str(int(wait) + 1).encode()),))

        async def record(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                if status in failed or 200 <= status < 300:
                    self._record(address, status not in failed)
            await send(message)

        await self.app(scope, receive, record)
