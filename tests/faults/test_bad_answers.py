"""Bad answers from a real aiohttp server on loopback: junk SSE chunks, junk /metrics, bodies that are not UTF-8, a
server info that is not an object, and an endpoint that hangs after its headers. The bench finishes with each bad
request counted as an error of its kind, the probe keeps going and says when it fails, the A/B keeps its trials.

Before the fix, `data: 5`, `{"choices":["x"]}`, `"completion_tokens":"abc"`, a deeply nested chunk and a 2 MiB
line each raised out of run_bench (the whole run and an A/B's trial were lost), the probe
task died of the same, a /metrics body that is not UTF-8 raised out of scrape_metrics, and a deeply nested
/get_server_info raised RecursionError.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from app.core.data import ServerState, ThroughputPoint
from app.core.measure import probe as probe_module
from app.core.measure.acceptance import AcceptanceMeter
from app.core.measure.bench import BenchSpec, run_bench
from app.core.measure.client import LINE_TOO_LONG, NOT_UTF8
from app.core.measure.experiment import Experiment, ExperimentSpec, parse_arm
from app.core.measure.http_probes import check_health, get_json, read_metrics, scrape_metrics, server_info
from app.core.measure.metrics import MetricsPoller, MetricsRate
from app.core.measure.probe import ProbeStatus, probe_completion, probe_loop
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import load_profile
from app.core.server.events import LifecycleView
from tests.helpers import REPO, serving

GOOD = b'data: {"choices": [{"index": 0, "text": " a b"}]}\n\n'

JUNK: dict[str, tuple[bytes, str]] = {
    # name: (what the server sends after one good chunk, the error kind the request ends with)
    "a number": (b"data: 5\n\n", "bad answer: a chunk that is not a JSON object"),
    "choices of strings": (b'data: {"choices":["x"]}\n\n', "bad answer: a choice that is not an object"),
    "tokens as text": (b'data: {"choices":[],"usage":{"completion_tokens":"abc"}}\n\n',
                       "bad answer: usage.completion_tokens is not a token count"),
    "not UTF-8": (b'data: {"choices":[{"text":"\xff\xfe"}]}\n\n', NOT_UTF8),
    "not JSON": (b"data: {not json\n\n", "bad answer: a chunk that is not JSON"),
    "deep nesting": (b"data: " + b"[" * 100_000 + b"\n\n", "bad answer: a chunk that is not JSON"),
    "choices a string": (b'data: {"choices":"abc"}\n\n', "bad answer: choices is not a list"),
    "text a number": (b'data: {"choices":[{"text":5}]}\n\n', "bad answer: a choice's text is not a string"),
    "delta a list": (b'data: {"choices":[{"delta":[1]}]}\n\n', "bad answer: a choice's delta is not an object"),
    "usage a number": (b'data: {"choices":[],"usage":7}\n\n', "bad answer: usage is not an object"),
    "meta count as text": (b'data: {"choices":[{"text":"a"}],"meta_info":{"spec_verify_ct":"abc"}}\n\n',
                           "bad answer: a meta_info count is not a count"),
    "huge line": (b"data: " + b"x" * (2 * 1024 * 1024) + b"\n\n", LINE_TOO_LONG),
}


class Script:
    """What the server answers: the next mode from `modes` for each completion request ("good" once empty); a
    JUNK name sends that junk after one good chunk, "first:" + a JUNK name before it (the probe parses few chunks
    after the first text, docs/decisions.md#probe-reader), "hang" sends its headers and then nothing."""

    def __init__(self) -> None:
        self.modes: list[str] = []
        self.info: bytes = b'{"version": "0.5.9", "tp_size": 2}'
        self.metrics: bytes = b""
        self.requests = 0


SCRIPT: web.AppKey[Script] = web.AppKey("script", Script)


async def _complete(request: web.Request) -> web.StreamResponse:
    script = request.app[SCRIPT]
    body = await request.json()
    script.requests += 1
    mode = script.modes.pop(0) if script.modes else "good"
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    try:
        if mode == "hang":  # headers sent, then nothing
            await asyncio.sleep(3600)
        first, _, kind = mode.rpartition(":")
        if first:
            await response.write(JUNK[kind][0])
        await response.write(GOOD)
        if kind != "good" and not first:
            await response.write(JUNK[kind][0])
        n = int(body["max_tokens"])
        for _ in range(2, n, 2):
            await response.write(GOOD)
            await asyncio.sleep(0.001)
        usage = {"completion_tokens": n, "prompt_tokens": 3, "total_tokens": n + 3}
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    except (ConnectionError, RuntimeError):  # the client gave up on this answer, as it should
        pass
    return response


async def _info(request: web.Request) -> web.Response:
    return web.Response(body=request.app[SCRIPT].info, content_type="application/json")


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[SCRIPT].metrics, content_type="text/plain")


async def _health_hangs(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(3600)
    return web.Response()


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Script]]:
    app = web.Application()
    script = Script()
    app[SCRIPT] = script
    app.router.add_post("/v1/completions", _complete)
    app.router.add_get("/get_server_info", _info)
    app.router.add_get("/version", _info)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health_hangs)
    async with serving(app, shutdown_timeout=0.1) as port:
        yield f"http://127.0.0.1:{port}", script


async def test_junk_sse_is_counted_by_kind_and_the_bench_finishes(server: tuple[str, Script]) -> None:
    url, script = server
    script.modes = [*JUNK, "good", "good", "good"]
    spec = BenchSpec(requests=len(script.modes), concurrency=3, max_tokens=8, warmup=0, input_len=8)
    result = await run_bench(url, "m", spec)
    summary = result.summary
    assert summary.requests == len(JUNK) + 3 and summary.completed == 3 and summary.errors == len(JUNK)
    assert Counter(r.error for r in result.results if not r.ok) == Counter(kind for _, kind in JUNK.values())
    assert summary.output_tokens == 3 * 8 and summary.output_tok_s is not None
    assert all(count >= 1 for count in summary.error_kinds.values()) and len(summary.error_kinds) == 5  # the top 5
    assert any(f"{len(JUNK)} of {len(JUNK) + 3} requests failed" in w for w in summary.warnings)


async def test_an_endpoint_that_hangs_after_its_headers_times_out_as_its_kind(server: tuple[str, Script]) -> None:
    url, script = server
    script.modes = ["hang", "hang", "good"]
    spec = BenchSpec(requests=3, concurrency=3, max_tokens=8, warmup=0, input_len=8)
    result = await asyncio.wait_for(run_bench(url, "m", spec, stall_timeout_s=0.3), timeout=10)
    assert result.summary.completed == 1 and result.summary.errors == 2
    assert list(result.summary.error_kinds) == ["Timeout on reading data from socket"]


async def test_the_probe_reader_turns_each_bad_answer_into_its_error(server: tuple[str, Script]) -> None:
    url, script = server
    async with aiohttp.ClientSession() as session:
        for mode in ("first:a number", "tokens as text", "first:not JSON", "huge line", "first:choices of strings",
                     "first:not UTF-8", "first:text a number"):
            script.modes = [mode]
            result = await probe_completion(session, url, "m", "p", 8)
            assert not result.ok and result.error == JUNK[mode.removeprefix("first:")][1], mode
        good = await probe_completion(session, url, "m", "p", 8)
        assert good.ok and good.output_tokens == 8


async def test_the_probe_keeps_going_reports_failing_and_recovers(
    server: tuple[str, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, script = server
    monkeypatch.setattr(probe_module, "PROBE_BACKOFF_S", (0.01, 0.05))
    script.modes = ["first:a number", "hang", "tokens as text", "huge line"]
    points: list[ThroughputPoint] = []
    errors: list[str] = []
    statuses: list[ProbeStatus] = []
    task = asyncio.create_task(probe_loop(url, "m", points.append, errors.append, max_tokens=8, min_decode_s=0.0,
                                          on_status=statuses.append, stall_timeout_s=0.3))
    try:
        for _ in range(200):
            if len(points) >= 2:
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert errors == [JUNK["a number"][1], "Timeout on reading data from socket",
                      JUNK["tokens as text"][1], LINE_TOO_LONG]
    assert len(points) >= 2 and all(p.source == "probe" and p.tokens_per_s > 0 for p in points)
    assert [s.state for s in statuses] == ["failing", "running", "stopped"]
    failing = statuses[0]
    assert failing.failures == 3 and failing.error == JUNK["tokens as text"][1] and failing.retry_in_s == 0.04
    assert statuses[-1].error == ""  # cancelled: asked to stop


async def test_the_probe_survives_an_error_no_reader_expects(
    server: tuple[str, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = server
    monkeypatch.setattr(probe_module, "PROBE_BACKOFF_S", (0.01, 0.05))
    real = probe_module.probe_completion
    calls = 0

    async def flaky(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        return await real(*args)

    monkeypatch.setattr(probe_module, "probe_completion", flaky)
    points: list[ThroughputPoint] = []
    errors: list[str] = []
    task = asyncio.create_task(probe_loop(url, "m", points.append, errors.append, max_tokens=8, min_decode_s=0.0))
    for _ in range(100):
        if points:
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert errors == ["RuntimeError: a bug"] and points


JUNK_METRICS = (b"# HELP vllm:generation_tokens_total tokens\n"
                b"vllm:generation_tokens_total{model_name=\"m\"} %d\n"
                b"vllm:num_requests_running NaN\n"
                b"vllm:spec_decode_num_drafts_total +Inf\n"
                b"vllm:spec_decode_num_accepted_tokens_total -5\n"
                b"\xff\xfe garbage \x00\n"
                b"odd{label=\"\xff\"} 3\n"
                b"just words\n"
                b"\n")


async def test_junk_metrics_keep_the_good_series_and_the_poller_runs(server: tuple[str, Script]) -> None:
    url, script = server
    script.metrics = JUNK_METRICS % 100
    values = await scrape_metrics(url)  # before: UnicodeDecodeError out of the scrape
    assert values is not None
    assert values["vllm:generation_tokens_total"] == 100 and values["odd"] == 3
    for junk in ("vllm:num_requests_running", "vllm:spec_decode_num_drafts_total",
                 "vllm:spec_decode_num_accepted_tokens_total"):
        assert junk not in values
    assert read_metrics((JUNK_METRICS % 100).decode(errors="replace"))[1] == 5  # NaN, Inf, -5, garbage, words
    poller = MetricsPoller(url, "vllm", period_s=0.05)
    rates: list[MetricsRate] = []
    errors: list[str] = []
    task = asyncio.create_task(poller.run(rates.append, errors.append))
    for n in range(200, 2000, 100):
        script.metrics = JUNK_METRICS % n
        await asyncio.sleep(0.06)
        if len(rates) >= 3:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(rates) >= 3 and not errors and all(r.tokens_per_s >= 0 and r.accept_len is None for r in rates)
    meter = AcceptanceMeter("vllm", url)
    await meter.start()
    assert await meter.stop() == (None, "no spec-decode counters in /metrics over the run")


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"version": "0.5.9", "tp_size": 2}', {"version": "0.5.9", "tp_size": 2}),
    (b'{"version": {"major": 0}, "tp_size": 2}', {"tp_size": 2}),  # a version that is not text is dropped
    (b'{"version": 5}', {}),
    (b"[1, 2]", None),
    (b'"text"', None),
    (b"\xff\xfe{", None),
    (b"[" * 100_000, None),  # before: RecursionError
    (b"", None),
])
async def test_server_info_that_is_not_an_object_of_the_right_types(
    server: tuple[str, Script], body: bytes, expected: dict[str, Any] | None
) -> None:
    url, script = server
    script.info = body
    assert await server_info(url, "vllm") == expected


async def test_a_body_over_the_cap_is_no_answer(server: tuple[str, Script], monkeypatch: pytest.MonkeyPatch) -> None:
    from app.core.measure import http_probes

    url, script = server
    monkeypatch.setattr(http_probes, "MAX_BODY_BYTES", 1000)
    script.info = b'{"pad": "' + b"x" * 5000 + b'"}'
    script.metrics = b"x 1\n" * 1000
    assert await get_json(url, "/get_server_info") is None
    assert await scrape_metrics(url) is None


async def test_a_health_endpoint_that_hangs_is_not_healthy(server: tuple[str, Script]) -> None:
    url, _ = server
    health = await asyncio.wait_for(check_health(url, timeout_s=0.3), timeout=5)
    assert not health.ok and health.status is None and health.error


class _Host:
    async def http_base(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"


class _Owner:
    """A duck-typed ServerOwner whose server is always READY; the experiment talks HTTP to the scripted server."""

    def __init__(self, profile: Any) -> None:
        self.host = _Host()
        self.profile = profile

    def subscribe(self, listener: Callable[[Any], None]) -> Callable[[], None]:
        return lambda: None

    def view(self) -> LifecycleView:
        return LifecycleView(state=ServerState.READY, since=0.0, record=None, profile=self.profile,
                             phase_times={"ready": 0.1}, notices=(), fatal=None, last_lines=(), holders=(),
                             health_ok=True, last_decode=None)

    async def relaunch(self, profile: Any, *, ready_timeout_s: float | None = None,
                       change: str | None = None) -> ServerState:
        self.profile = profile
        return ServerState.READY


async def test_the_experiment_keeps_its_trials_through_junk(server: tuple[str, Script], tmp_path: Path) -> None:
    url, script = server
    port = int(url.rsplit(":", 1)[1])
    script.info = b"[not, an, object"
    kinds = [k for k in JUNK if k != "huge line"]
    script.modes = [mode for kind in kinds for mode in ("good", kind)]  # every other request is junk
    profile = parse_arm(load_profile(REPO / "profiles" / "demo.toml"), f"port={port}", "base").profile
    spec = ExperimentSpec([parse_arm(profile, "", "A"), parse_arm(profile, "speculative-num-steps=2", "B")], 2,
                          BenchSpec(requests=4, concurrency=2, max_tokens=8, warmup=1, input_len=8), launches=1)
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        result = await Experiment(spec, _Owner(profile), store).run()  # type: ignore[arg-type]
        assert result.status == "done"
        assert [len(arm.values) for arm in result.arms] == [2, 2]  # every trial kept
        assert sum(arm.errors for arm in result.arms) > 0 and all(arm.requests == 8 for arm in result.arms)
        stored = store.run(result.run_id or 0)
        assert stored is not None and stored.status == "done" and len(stored.trials) == 4
