"""HTTP probes of a running server: /health, server info (SGLang /get_server_info, vLLM /version), /metrics."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from app.core.server.health import Health, check_url

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
"""A series name tunedash reads (the exposition's classic names; the parser itself takes any name before a `{`)."""

METRIC_LINE_MAX = 64 * 1024
"""The longest /metrics line read (characters); a longer one is skipped and counted (the parser's label scan is
per character: docs/decisions.md#metrics-parser)."""

MAX_BODY_BYTES = 16 * 1024 * 1024
"""The most of a probe's answer that is read (/metrics, server info); a longer body counts as no answer."""


_Body = TypeVar("_Body")


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds)


async def _get_ok(
    url: str, timeout_s: float, read: Callable[[aiohttp.ClientResponse], Awaitable[_Body]]
) -> _Body | None:
    """GET url and `read` its body when it answers 200; None for another status or no answer.

    What `read` raises beyond the transport's errors (a body that is not JSON) reaches the caller.
    """
    try:
        async with (
            aiohttp.ClientSession(timeout=_timeout(timeout_s)) as session,
            session.get(url) as response,
        ):
            if response.status != 200:
                return None
            return await read(response)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None


async def _capped_body(response: aiohttp.ClientResponse) -> bytes | None:
    """The body, or None when it passes MAX_BODY_BYTES (read no further than that)."""
    parts: list[bytes] = []
    size = 0
    async for part in response.content.iter_any():
        size += len(part)
        if size > MAX_BODY_BYTES:
            return None
        parts.append(part)
    return b"".join(parts)


async def check_health(base_url: str, timeout_s: float = 2.0) -> Health:
    """GET the server's /health (app.core.server.health.check_url)."""
    return await check_url(f"{base_url}/health", timeout_s)


async def get_json(base_url: str, path: str, timeout_s: float = 3.0) -> dict[str, Any] | None:
    """GET a JSON object; None when the server does not answer with one (not JSON, not UTF-8, another type)."""
    body = await _get_ok(f"{base_url}{path}", timeout_s, _capped_body)
    if body is None:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


async def server_info(base_url: str, backend: str) -> dict[str, Any] | None:
    """The server's own view of its settings: SGLang's resolved ServerArgs, vLLM's version.

    A `version` that is not a string is dropped (the header shows it as text).
    """
    if backend == "sglang":
        info = await get_json(base_url, "/get_server_info")
        if info is None:
            info = await get_json(base_url, "/server_info")
    else:
        info = await get_json(base_url, "/version")
    if info is not None and not isinstance(info.get("version", ""), str):
        del info["version"]
    return info


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value}; also sums series per bare name under `name`."""
    return read_metrics(text)[0]


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


_PLAIN_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
PLAIN_SAMPLE = re.compile(
    rf"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{(?P<labels>(?:{_PLAIN_LABEL})(?:,{_PLAIN_LABEL})*,?)?\}})?"
    r"[ \t]+(?P<value>[^ \t]+)")
"""A sample line in the form servers print (no escapes in label values, no spaces inside the label set, no
timestamp), which `_plain_sample` reads without the parser's per-character scan; anything else goes to the parser.
tests/unit/test_metrics_exposition.py checks, with hypothesis, that both read such a line the same."""
_PLAIN_LABELS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


def _plain_sample(line: str) -> tuple[str, dict[str, str], float] | None:
    """(name, labels, value) of a PLAIN_SAMPLE line; None when the line is not one, or is one that prometheus_client
    might read otherwise (a reserved `__` label, a label twice, a value with `_`): the parser decides those."""
    match = PLAIN_SAMPLE.fullmatch(line.strip())
    if match is None or "_" in match["value"]:
        return None
    pairs = _PLAIN_LABELS.findall(match["labels"] or "")
    labels = dict(pairs)
    if len(labels) != len(pairs) or any(name.startswith("__") for name in labels):
        return None
    try:
        return match["name"], labels, float(match["value"])
    except ValueError:
        return None


def _sample_line(line: str) -> tuple[str, dict[str, str], float] | None:
    """One sample line as prometheus_client's text parser reads it: (name, labels, value), or None when it is not
    one sample line (the parser refuses it, it holds more than one, or its name is not a METRIC_NAME). The plain
    form servers print is read by `_plain_sample`, the same way and about 10 times faster."""
    plain = _plain_sample(line)
    if plain is not None:
        return plain
    try:
        samples = [sample for family in text_string_to_metric_families(line) for sample in family.samples]
    except (ValueError, IndexError, TypeError, KeyError):
        return None
    if len(samples) != 1 or not METRIC_NAME.fullmatch(samples[0].name):
        return None
    sample = samples[0]
    try:
        value = float(sample.value)
    except (OverflowError, ValueError, TypeError):
        return None
    return sample.name, sample.labels, value


def read_metrics(text: str) -> tuple[dict[str, float], int]:
    """parse_metrics's values, and how many lines were skipped: a line prometheus_client's text parser refuses (a
    label value may hold `}` or `,`: `model_name="/models/a}b"` is one series), one over METRIC_LINE_MAX, or a
    value that is not a finite number >= 0 (NaN, Inf, a negative count: every series tunedash reads is a count or
    a gauge of requests). Each line is parsed on its own, so one bad line costs only itself; TYPE lines do not
    rename samples (the parser's whole-text reading would add `_total` to a counter's samples). A series' key is
    `name{label="value",...}` in the server's label order, values escaped as in the exposition. Comments and empty
    lines are not counted. A bare-name sum that overflows is dropped."""
    values: dict[str, float] = {}
    skipped = 0
    for line in text.split("\n"):  # the exposition's only line break (a label value may hold U+2028)
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        sample = _sample_line(line) if len(line) <= METRIC_LINE_MAX else None
        if sample is None or not math.isfinite(sample[2]) or sample[2] < 0:
            skipped += 1
            continue
        name, labels, value = sample
        if labels:
            rendered = ",".join(f'{key}="{_escape_label_value(label)}"' for key, label in labels.items())
            values[f"{name}{{{rendered}}}"] = value
        values[name] = values.get(name, 0.0) + value
    return {key: value for key, value in values.items() if math.isfinite(value)}, skipped


async def scrape_metrics(base_url: str, timeout_s: float = 3.0) -> dict[str, float] | None:
    """One /metrics scrape (parse_metrics, in a thread: a long body is seconds of parsing); None when it does not
    answer 200 within `timeout_s`, or the body is over MAX_BODY_BYTES. Bytes that are not UTF-8 are replaced, so
    their lines are skipped as junk."""
    body = await _get_ok(f"{base_url}/metrics", timeout_s, _capped_body)
    if body is None:
        return None
    return await asyncio.to_thread(parse_metrics, body.decode(errors="replace"))
