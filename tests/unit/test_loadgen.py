"""The load generator against a scripted OpenAI-style server: token counts under speculative decoding
(several tokens per chunk), missing usage, errors counted and kept, warm-up excluded, prompts, percentiles."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from app.core.data import DecodeStats, LogLine
from app.core.measure.acceptance import AcceptanceMeter
from app.core.measure.bench import BenchSpec, PromptFileError, build_prompts, percentile, run_bench
from app.core.measure.client import completion_request, stream_completion
from app.core.measure.probe import probe_completion
from app.core.measure.stream_http import StreamPool
from tests.helpers import serving


class Script:
    """What the fake server does: tokens per chunk, whether it sends usage, which requests fail."""

    def __init__(self) -> None:
        self.tokens_per_chunk = 3
        self.usage = True
        self.fail_every = 0  # every n-th request answers HTTP 500
        self.midstream_error_every = 0
        self.seen: list[dict[str, Any]] = []
        self.sent_tokens = 0


SCRIPT: web.AppKey[Script] = web.AppKey("script", Script)


async def _handler(request: web.Request) -> web.StreamResponse:
    script = request.app[SCRIPT]
    body = await request.json()
    script.seen.append(body)
    n = len(script.seen)
    if script.fail_every and n % script.fail_every == 0:
        return web.json_response({"message": "overloaded"}, status=500)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    max_tokens = int(body["max_tokens"])
    done = 0
    while done < max_tokens:
        k = min(script.tokens_per_chunk, max_tokens - done)
        if script.midstream_error_every and n % script.midstream_error_every == 0 and done > 0:
            await resp.write(b'data: {"error": {"message": "engine died"}}\n\n')
            return resp
        text = " tok" * k
        chunk = {"choices": [{"index": 0, "text": text}]} if "prompt" in body else \
            {"choices": [{"index": 0, "delta": {"content": text}}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        done += k
        await asyncio.sleep(0)
    script.sent_tokens += done
    if script.usage and (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 5, "completion_tokens": done, "total_tokens": done + 5}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Script]]:
    app = web.Application()
    script = Script()
    app[SCRIPT] = script
    app.router.add_post("/v1/completions", _handler)
    app.router.add_post("/v1/chat/completions", _handler)
    async with serving(app) as port:
        yield f"http://127.0.0.1:{port}", script


async def test_tokens_come_from_usage_not_chunks(server):
    url, script = server
    spec = BenchSpec(requests=6, concurrency=3, input_len=16, max_tokens=20, warmup=0)
    result = await run_bench(url, "m", spec)
    s = result.summary
    assert s.completed == 6 and s.errors == 0 and s.usage_missing == 0
    assert s.output_tokens == script.sent_tokens == 6 * 20
    assert all(r.chunks == 7 and r.output_tokens == 20 for r in result.results)  # 3 tokens a chunk
    assert s.output_tok_s is not None and s.output_tok_s > 0
    assert s.tpot_ms["p50"] is not None and s.ttft_ms["p50"] is not None
    assert not s.warnings


async def test_missing_usage_falls_back_to_chunks_and_warns(server):
    url, script = server
    script.usage = False
    result = await run_bench(url, "m", BenchSpec(requests=2, concurrency=1, max_tokens=9, warmup=0))
    s = result.summary
    assert s.usage_missing == 2
    assert s.output_tokens == 2 * 3  # chunks, too low: the warning says so
    assert any("no usage" in w for w in s.warnings)


async def test_errors_are_counted_and_kept(server):
    url, script = server
    script.fail_every = 3
    script.midstream_error_every = 4
    result = await run_bench(url, "m", BenchSpec(requests=12, concurrency=2, max_tokens=6, warmup=0))
    s = result.summary
    assert s.requests == 12 and len(result.results) == 12
    assert s.errors == 4 + 2  # requests 3, 6, 9, 12 answer 500; 4 and 8 break mid-stream
    assert s.completed == 6 and s.output_tokens == 6 * 6
    assert any("HTTP 500" in k for k in s.error_kinds) and any("engine died" in k for k in s.error_kinds)
    assert any("6 of 12 requests failed" in w for w in s.warnings)


async def test_probe_parses_few_chunks_and_agrees_with_the_full_client(server):
    """The probe's reader (few chunks parsed) gives the full client's tokens, chunks and timing order."""
    import aiohttp

    url, script = server
    async with aiohttp.ClientSession() as session, StreamPool(url, 1) as pool:
        full = await stream_completion(pool, completion_request(url, "m", "p", 20))
        probe = await probe_completion(session, url, "m", "p", 20)
        assert probe.ok and probe.output_tokens == full.output_tokens == 20  # usage, not 7 chunks
        assert probe.chunks == full.chunks == 7 and not probe.usage_missing
        assert probe.ttft_s is not None and probe.latency_s is not None and 0 < probe.ttft_s <= probe.latency_s
        assert probe.decode_tps is not None
        script.usage = False
        fallback = await probe_completion(session, url, "m", "p", 9)
        assert fallback.usage_missing and fallback.output_tokens == 3  # chunks, as the full client counts
        script.usage, script.midstream_error_every = True, 1
        broken = await probe_completion(session, url, "m", "p", 9)
        assert not broken.ok and "engine died" in broken.error


async def test_unreachable_server_is_an_error_per_request_not_a_crash():
    result = await run_bench("http://127.0.0.1:9", "m", BenchSpec(requests=3, concurrency=2, warmup=0))
    assert result.summary.errors == 3 and result.summary.output_tok_s is None


async def test_warmup_is_sent_first_and_excluded(server):
    url, script = server
    spec = BenchSpec(requests=4, concurrency=2, max_tokens=5, warmup=2, endpoint="chat")
    result = await run_bench(url, "m", spec)
    assert len(script.seen) == 6 and len(result.results) == 4
    assert result.summary.output_tokens == 20
    body = script.seen[0]
    assert body["messages"][0]["role"] == "user" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    # the measured requests use other prompts than the warm-up ones, and the same ones every run
    warm = {s["messages"][0]["content"] for s in script.seen[:2]}
    measured = {s["messages"][0]["content"] for s in script.seen[2:]}
    assert not warm & measured
    assert measured == set(build_prompts(spec, 4, offset=2))


def test_prompts_are_deterministic_and_sized(tmp_path: Path):
    spec = BenchSpec(input_len=400, seed=5)
    first, again = build_prompts(spec, 3), build_prompts(spec, 3)
    assert first == again and len(set(first)) == 3
    assert len(first[0].split()) == 300
    assert build_prompts(BenchSpec(input_len=400, seed=6), 1) != first[:1]
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n\ntwo\n")
    assert build_prompts(BenchSpec(prompt_file=prompts), 3) == ["one", "two", "one"]
    with pytest.raises(PromptFileError, match=r"p2\.txt"):
        build_prompts(BenchSpec(prompt_file=tmp_path / "p2.txt"), 1)


def test_percentiles():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)


async def test_acceptance_from_decode_lines_only_inside_the_window():
    meter = AcceptanceMeter("sglang", "http://127.0.0.1:9")
    line = LogLine(1, "x")
    meter.feed(DecodeStats(50.0, line, accept_len=9.0))  # before start: ignored
    await meter.start()
    meter.feed(DecodeStats(50.0, line, accept_len=3.0))
    meter.feed(DecodeStats(50.0, line, accept_len=3.4))
    assert await meter.stop() == (pytest.approx(3.2), "log")
    await meter.start()
    value, why = await meter.stop()
    assert value is None and "no decode log line" in why
