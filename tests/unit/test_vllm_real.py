"""The vLLM path against what the real vLLM 0.32.0 CPU build did: its log, its --help, its /metrics counters.

tests/data/logs/vllm_cpu_0320_real.log is a real log of `profiles/vllm-cpu-tiny.toml` (routes and access
lines trimmed), captured while `tunedash probe` ran against it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.core.data import DecodeStats, FatalEvent, Phase, PhaseEvent, ReadyEvent, SpecDecodeStats
from app.core.flags.discovery import offered_catalog, parse_help_flags, rejected_flags
from app.core.logs.parser import parse_lines, read_log_lines
from app.core.measure.http_probes import parse_metrics
from app.core.measure.metrics import MetricsPoller, MetricsRate, MetricsReading, rate_between, spec_decode_totals
from app.core.profiles.loading import parse_profile
from app.core.profiles.types import ProfileError
from tests.helpers import DATA, REPO

LOG = DATA / "logs" / "vllm_cpu_0320_real.log"


# ---- the real log ------------------------------------------------------------------------------------
def test_real_log_is_ready_at_uvicorn_not_at_starting_vllm_server() -> None:
    events = list(parse_lines(read_log_lines(LOG), "vllm").events)
    (ready,) = [e for e in events if isinstance(e, ReadyEvent)]
    assert ready.line.text == "INFO:     Application startup complete."
    warmup = next(e for e in events if isinstance(e, PhaseEvent) and e.phase is Phase.WARMUP)
    assert "Starting vLLM server on http://0.0.0.0:8011" in warmup.line.text
    assert warmup.line.number < ready.line.number
    assert not [e for e in events if isinstance(e, FatalEvent)]


def test_real_log_phases_version_weights_and_cpu_kv_cache() -> None:
    phases = [e for e in parse_lines(read_log_lines(LOG), "vllm").events if isinstance(e, PhaseEvent)]
    init = phases[0]
    assert (init.phase, init.detail.get("version")) == (Phase.INIT, "0.32.0")  # from the ASCII-art banner
    weights = next(e for e in phases if e.phase is Phase.WEIGHTS)
    assert weights.seconds == pytest.approx(0.236178)  # "Initializing model took ..." (dummy weights)
    kv = next(e for e in phases if e.phase is Phase.KV_CACHE)
    assert kv.detail["device"] == "CPU" and kv.detail["tokens"] == "131072"


def test_real_log_throughput_and_ngram_acceptance() -> None:
    events = list(parse_lines(read_log_lines(LOG), "vllm").events)
    stats = [e for e in events if isinstance(e, DecodeStats)]
    assert [s.gen_tps for s in stats] == [151.4, 232.3, 96.5]
    assert stats[0].running == 1 and stats[0].token_usage == pytest.approx(0.004)
    spec = [e for e in events if isinstance(e, SpecDecodeStats)]
    assert [s.mean_accept_len for s in spec] == [3.92, 3.92, 3.92]
    assert spec[0].accept_rate == pytest.approx(1.0)
    assert (spec[0].accepted, spec[0].drafted) == (551, 551)


# ---- discovery ---------------------------------------------------------------------------------------
HELP_EXCERPT = """usage: api_server.py [-h] [--headless] [--model MODEL]
                     [--kv-cache-memory-bytes KV_CACHE_MEMORY_BYTES]
                     [--enable-prefix-caching | --no-enable-prefix-caching]

options:
  -h, --help            show this help message and exit
  --headless            Run in headless mode. See multi-node data parallel
                        documentation for more details. (default: False)
  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE
                        Number of tensor parallel groups. (default: 1)
  --gpu-memory-utilization GPU_MEMORY_UTILIZATION, --device-memory-utilization GPU_MEMORY_UTILIZATION
                        The fraction of GPU memory to be used for the model
                        executor. Unlike --not-a-flag-mentioned-in-help it is
  --enable-prefix-caching, --no-enable-prefix-caching
                        Whether to enable prefix caching.
  --speculative-config SPECULATIVE_CONFIG, -sc SPECULATIVE_CONFIG
"""


def test_help_parser_reads_option_lines_only() -> None:
    flags = parse_help_flags(HELP_EXCERPT)
    assert flags == {"headless", "tensor-parallel-size", "tp", "gpu-memory-utilization",
                     "device-memory-utilization", "enable-prefix-caching", "no-enable-prefix-caching",
                     "speculative-config", "sc"}


def test_catalog_offers_only_what_the_server_accepts() -> None:
    accepted = parse_help_flags(HELP_EXCERPT)
    offered = offered_catalog("vllm", accepted)
    assert "tensor-parallel-size" in offered and "speculative-config" in offered
    assert "swap-space" not in offered  # gone from vLLM 0.32.0's --help
    assert "swap-space" in offered_catalog("vllm", None)  # unknown: the whole catalog
    assert rejected_flags("vllm", {"swap-space": 4.0, "tensor-parallel-size": 1}, accepted) == ["swap-space"]


class _Stop(Exception):
    """Ends the poller's loop in a test."""


# ---- /metrics ----------------------------------------------------------------------------------------
def _metrics(gen: float, accepted: float, drafts: float, draft_tokens: float) -> dict[str, float]:
    labels = 'engine="0",model_name="/m"'
    return parse_metrics("\n".join([
        f"vllm:generation_tokens_total{{{labels}}} {gen}",
        f"vllm:generation_tokens_created{{{labels}}} 1.79e+09",
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}",
        f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {draft_tokens}",
        f"vllm:num_requests_running{{{labels}}} 1.0",
    ]))


def test_rate_between_two_scrapes_with_acceptance_like_the_log() -> None:
    before = MetricsReading(_metrics(100, 0, 0, 0), 10.0, 1000.0)
    after = MetricsReading(_metrics(520, 1750, 600, 1750), 12.0, 1002.0)
    rate = rate_between(before, after, "vllm")
    assert rate is not None
    assert rate.tokens_per_s == pytest.approx(210.0)
    assert rate.accept_len == pytest.approx(1 + 1750 / 600)  # what the log prints as "Mean acceptance length"
    assert rate.accept_rate == pytest.approx(1.0)
    point = rate.point()
    assert (point.source, point.at) == ("metrics", 1002.0)


def test_counter_reset_after_a_relaunch_gives_no_rate() -> None:
    before = MetricsReading(_metrics(5000, 0, 0, 0), 10.0, 1000.0)
    after = MetricsReading(_metrics(40, 0, 0, 0), 12.0, 1002.0)
    assert rate_between(before, after, "vllm") is None
    assert spec_decode_totals({}, {"vllm:generation_tokens_total": 3.0}, "vllm") is None  # spec decoding off


async def test_poller_reports_windows_and_an_idle_window_as_zero() -> None:
    answers = iter([_metrics(0, 0, 0, 0), _metrics(300, 0, 0, 0), None, _metrics(300, 0, 0, 0),
                    _metrics(300, 0, 0, 0)])

    async def scrape(_base: str) -> dict[str, float] | None:
        try:
            return next(answers)
        except StopIteration:
            raise _Stop from None

    rates: list[MetricsRate] = []
    errors: list[str] = []
    poller = MetricsPoller("http://x", "vllm", period_s=0.0, scrape=scrape)
    with pytest.raises(_Stop):
        await poller.run(rates.append, errors.append)
    assert [r.tokens for r in rates] == [300.0, 0.0]  # the gap after the failed scrape starts a new window
    assert errors == ["http://x/metrics did not answer"]


# ---- the shipped profile -----------------------------------------------------------------------------
def test_shipped_profile_expands_env_and_home(monkeypatch: pytest.MonkeyPatch) -> None:
    path = REPO / "profiles" / "vllm-cpu-tiny.toml"
    monkeypatch.delenv("TUNEDASH_VLLM_VENV", raising=False)
    monkeypatch.setenv("TUNEDASH_VLLM_MODEL", "/opt/tiny")
    profile = parse_profile(path.read_text(), path)
    assert profile.python == os.path.expanduser("~/.cache/tunedash/vllm-cpu-venv/bin/python")
    assert profile.model == "/opt/tiny"
    assert profile.gpus == () and profile.env["VLLM_TARGET_DEVICE"] == "cpu"
    assert [t.key for t in profile.toggles] == ["s", "e", "n"]


def test_unset_variable_without_default_names_the_file_and_key(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TD_NO_SUCH_VAR", raising=False)
    path = tmp_path / "p.toml"
    with pytest.raises(ProfileError, match=r"p\.toml: python: the environment variable TD_NO_SUCH_VAR is not set"):
        parse_profile('backend = "vllm"\nmodel = "m"\npython = "${TD_NO_SUCH_VAR}/bin/python"\n', path)
    ssh = parse_profile('backend = "vllm"\nhost = "ssh://gpu1"\nmodel = "~/m"\n', path)
    assert ssh.model == "~/m"  # the remote's home, not ours


# ---- the probe against a fast server -----------------------------------------------------------------
async def test_probe_lengthens_requests_whose_answer_comes_in_a_burst() -> None:
    """Real vLLM on CPU answers 96 tokens in ~0.3 s; a stall before the first chunk then gave 165,000 tok/s.
    A burst (every chunk at once) is not plotted until the requests are as long as the probe allows."""
    import asyncio
    import json

    from aiohttp import web

    from app.core.measure.probe import probe_loop

    asked: list[int] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        asked.append(int(body["max_tokens"]))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"] // 4):
            await resp.write(f"data: {json.dumps({'choices': [{'index': 0, 'text': ' a b c d'}]})}\n\n".encode())
        usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    points: list[float] = []
    task = asyncio.create_task(probe_loop(f"http://127.0.0.1:{port}", "m", lambda p: points.append(p.tokens_per_s),
                                          lambda e: None))
    try:
        for _ in range(200):
            if points:
                break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await runner.cleanup()
    assert asked[:4] == [96, 192, 384, 768]
    assert points  # at the longest request every answer counts
