"""HTTP probes of a running server: /health, server info (SGLang /get_server_info, vLLM /version), /metrics."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import aiohttp

METRIC_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


@dataclass(frozen=True)
class Health:
    """One /health answer: the status code, or the reason there was none."""

    ok: bool
    status: int | None
    error: str = ""


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds)


async def check_health(base_url: str, timeout_s: float = 2.0) -> Health:
    return await check_url(f"{base_url}/health", timeout_s)


async def check_url(url: str, timeout_s: float = 2.0) -> Health:
    """GET any URL (a custom profile's health_url); ok when it answers 200."""
    try:
        async with (
            aiohttp.ClientSession(timeout=_timeout(timeout_s)) as session,
            session.get(url) as response,
        ):
            return Health(response.status == 200, response.status)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return Health(False, None, str(exc) or type(exc).__name__)


async def get_json(base_url: str, path: str, timeout_s: float = 3.0) -> dict[str, Any] | None:
    """GET a JSON document; None when the server does not answer with JSON."""
    try:
        async with (
            aiohttp.ClientSession(timeout=_timeout(timeout_s)) as session,
            session.get(f"{base_url}{path}") as response,
        ):
            if response.status != 200:
                return None
            data = await response.json(content_type=None)
            return data if isinstance(data, dict) else None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None


async def server_info(base_url: str, backend: str) -> dict[str, Any] | None:
    """The server's own view of its settings: SGLang's resolved ServerArgs, vLLM's version."""
    if backend == "sglang":
        info = await get_json(base_url, "/get_server_info")
        return info if info is not None else await get_json(base_url, "/server_info")
    return await get_json(base_url, "/version")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value}; also sums series per bare name under `name`."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = METRIC_LINE.match(line)
        if not match:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        name = match["name"]
        labels = match["labels"]
        if labels:
            values[f"{name}{{{labels}}}"] = value
        values[name] = values.get(name, 0.0) + value
    return values


async def scrape_metrics(base_url: str, timeout_s: float = 3.0) -> dict[str, float] | None:
    try:
        async with (
            aiohttp.ClientSession(timeout=_timeout(timeout_s)) as session,
            session.get(f"{base_url}/metrics") as response,
        ):
            if response.status != 200:
                return None
            return parse_metrics(await response.text())
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
