"""Whether a server answers: one GET of its health URL (`check_url`) and the answer as a `Health`.

The lifecycle waits on it during startup and watches a READY server with it; `measure.http_probes.check_health`
asks a server's `/health` through it.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class Health:
    """One /health answer: the status code, or the reason there was none."""

    ok: bool
    status: int | None
    error: str = ""


async def check_url(url: str, timeout_s: float = 2.0) -> Health:
    """GET any URL (a custom profile's health_url); ok when it answers 200."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(url) as response,
        ):
            return Health(response.status == 200, response.status)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return Health(False, None, str(exc) or type(exc).__name__)
