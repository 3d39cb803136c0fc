"""Benchmark runs: a fixed request set sent N at concurrency C, its percentiles and summary.

A benchmark run sends its warm-up requests first and leaves them out of the results; the request set is
deterministic (seeded synthetic prompts, or the lines of a prompt file). One StreamPool (kept connections, as
many as the concurrency) serves a whole run, warm-up included: `concurrency` workers take the next request index,
so a run costs no per-request session, connection or task set-up.

With an energy meter (app.core.telemetry.energy) the measured requests are also a window of the GPUs' energy:
`BenchSummary.energy` is None or the J/token dict, and `energy_note` says why when there is none. With SLOs in
the spec (`[bench]` slo_ttft_ms, slo_tpot_ms) the summary gives goodput beside throughput: completed requests
per second whose TTFT and TPOT are both within them (a one-token answer has no TPOT and meets a TPOT SLO).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.core.errors import TunedashError
from app.core.measure.client import (
    STALL_TIMEOUT_S,
    RequestResult,
    completion_request,
    stream_completion,
    synthetic_prompt,
)
from app.core.measure.stream_http import StreamPool
from app.core.profiles.types import BenchSettings
from app.core.telemetry.energy import METHOD_TEXT, EnergyMeter, EnergyReading

WORDS_PER_TOKEN = 0.75  # synthetic prompts: about 4 tokens per 3 words
NOT_MEASURED = "not measured (no energy meter)"


class PromptFileError(TunedashError, ValueError):
    """A prompt file that cannot be used; the message names the file."""

    title = "Bad prompt file"


@dataclass(frozen=True)
class BenchSpec:
    """The fixed request set of one benchmark run (or one A/B trial)."""

    requests: int = 32
    concurrency: int = 4
    input_len: int = 512  # prompt length in tokens (synthetic prompts; about 0.75 words per token)
    max_tokens: int = 256
    warmup: int = 2  # requests sent first and left out of the results
    endpoint: str = "completions"  # "completions" | "chat"
    seed: int = 0
    ignore_eos: bool = True
    prompt_file: Path | None = None
    timeout_s: float = 600.0  # per request
    slo_ttft_ms: float | None = None  # goodput's SLOs (None: not judged)
    slo_tpot_ms: float | None = None

    @classmethod
    def from_settings(cls, bench: BenchSettings, **overrides: Any) -> BenchSpec:
        """The profile's [bench] table, with the non-None overrides on top."""
        base: dict[str, Any] = {
            "requests": bench.requests, "concurrency": bench.concurrency, "input_len": bench.input_len,
            "max_tokens": bench.output_len, "warmup": bench.warmup, "endpoint": bench.endpoint, "seed": bench.seed,
            "slo_ttft_ms": bench.slo_ttft_ms, "slo_tpot_ms": bench.slo_tpot_ms,
        }
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def to_json(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["prompt_file"] = str(self.prompt_file) if self.prompt_file else None
        return data


def build_prompts(spec: BenchSpec, count: int, offset: int = 0) -> list[str]:
    """`count` prompts: lines of the prompt file (cycled), else seeded synthetic prompts of input_len tokens."""
    if spec.prompt_file is not None:
        try:
            lines = [ln for ln in spec.prompt_file.read_text(encoding="utf-8").splitlines() if ln.strip()]
        except OSError as exc:
            raise PromptFileError(f"{spec.prompt_file}: cannot read the prompt file ({exc.strerror or exc})") from None
        if not lines:
            raise PromptFileError(f"{spec.prompt_file}: the prompt file has no non-empty line; one prompt per line")
        return [lines[(offset + i) % len(lines)] for i in range(count)]
    words = max(1, round(spec.input_len * WORDS_PER_TOKEN))
    return [synthetic_prompt(words, spec.seed * 1_000_003 + offset + i) for i in range(count)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between order statistics; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class BenchSummary:
    """Aggregates of one run. Values that could not be measured are None (e.g. no successful request)."""

    requests: int
    completed: int
    errors: int
    error_kinds: dict[str, int]
    usage_missing: int
    output_tokens: int
    wall_s: float
    output_tok_s: float | None  # all completed requests' tokens / the run's wall time
    request_rate: float | None
    stream_decode_tok_s: float | None  # mean over requests of 1 / TPOT
    ttft_ms: dict[str, float | None]  # p50, p90, p99, mean
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    accept_len: float | None = None
    accept_source: str = ""  # "log", "meta", "metrics", or why there is none
    # None or {"method", "joules", "gpus", "mean_w_per_gpu", "output_tokens", "j_per_token", "tokens_per_j"}
    energy: dict[str, Any] | None = None
    energy_note: str = NOT_MEASURED  # why `energy` is None, with the method; "" when measured
    slo: dict[str, float | None] | None = None  # {"ttft_ms", "tpot_ms"} the run was judged by; None: no SLO
    slo_met: int | None = None  # completed requests within every SLO given
    goodput_rps: float | None = None  # slo_met / wall_s

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BenchSummary:
        """A summary as the store holds it (`to_json`, accept_len and accept_source included). A key a run stored
        before it existed takes its default (no energy meter, no SLO; counts 0, figures None); unknown keys are
        dropped, so `from_json(s.to_json()) == s`."""
        kinds, energy, slo = data.get("error_kinds"), data.get("energy"), data.get("slo")
        wall = _number(data.get("wall_s"))
        met = data.get("slo_met")
        return cls(
            requests=_count(data.get("requests")), completed=_count(data.get("completed")),
            errors=_count(data.get("errors")),
            error_kinds={str(k): _count(v) for k, v in kinds.items()} if isinstance(kinds, Mapping) else {},
            usage_missing=_count(data.get("usage_missing")), output_tokens=_count(data.get("output_tokens")),
            wall_s=0.0 if wall is None else wall, output_tok_s=_number(data.get("output_tok_s")),
            request_rate=_number(data.get("request_rate")),
            stream_decode_tok_s=_number(data.get("stream_decode_tok_s")), ttft_ms=_dist(data.get("ttft_ms")),
            tpot_ms=_dist(data.get("tpot_ms")), itl_ms=_dist(data.get("itl_ms")), e2e_ms=_dist(data.get("e2e_ms")),
            accept_len=_number(data.get("accept_len")), accept_source=str(data.get("accept_source") or ""),
            energy=dict(energy) if isinstance(energy, Mapping) and _usable_energy(energy) else None,
            energy_note=str(data.get("energy_note", NOT_MEASURED) or ""),
            slo={"ttft_ms": _number(slo.get("ttft_ms")), "tpot_ms": _number(slo.get("tpot_ms"))}
            if isinstance(slo, Mapping) else None,
            slo_met=_count(met) if met is not None else None,
            goodput_rps=_number(data.get("goodput_rps")))

    @property
    def warnings(self) -> list[str]:
        notes = []
        if self.usage_missing:
            notes.append(f"{self.usage_missing} answers had no usage: tokens counted from chunks (too low "
                         "under speculative decoding); does the server support stream_options.include_usage?")
        if self.errors:
            kinds = "; ".join(f"{n} x {text}" for text, n in self.error_kinds.items())
            notes.append(f"{self.errors} of {self.requests} requests failed: {kinds}")
        return notes


def meets_slo(result: RequestResult, ttft_ms: float | None, tpot_ms: float | None) -> bool:
    """Whether a request finished within both SLOs (None: that one is not judged)."""
    if not result.ok:
        return False
    if ttft_ms is not None and (result.ttft_s is None or result.ttft_s * 1000 > ttft_ms):
        return False
    tpot = result.tpot_s
    return tpot_ms is None or tpot is None or tpot * 1000 <= tpot_ms


def _dist_ms(values: Sequence[float]) -> dict[str, float | None]:
    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 3)

    return {"p50": ms(percentile(values, 50)), "p90": ms(percentile(values, 90)), "p99": ms(percentile(values, 99)),
            "mean": ms(statistics.fmean(values)) if values else None}


def summarize(results: Sequence[RequestResult], wall_s: float, *, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None, energy: EnergyReading | None = None) -> BenchSummary:
    """The run's aggregates; goodput when an SLO is given, energy when a reading is given."""
    ok = [r for r in results if r.ok]
    errors = Counter((r.error or "failed")[:120] for r in results if not r.ok)
    tokens = sum(r.output_tokens for r in ok)
    decode = [d for r in ok if (d := r.decode_tps) is not None]
    metas = [r.accept_len for r in ok if r.accept_len is not None]
    return BenchSummary(
        requests=len(results),
        completed=len(ok),
        errors=len(results) - len(ok),
        error_kinds=dict(errors.most_common(5)),
        usage_missing=sum(1 for r in ok if r.usage_missing),
        output_tokens=tokens,
        wall_s=round(wall_s, 4),
        output_tok_s=tokens / wall_s if ok and wall_s > 0 else None,
        request_rate=len(ok) / wall_s if ok and wall_s > 0 else None,
        stream_decode_tok_s=statistics.fmean(decode) if decode else None,
        ttft_ms=_dist_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_ms=_dist_ms([t for r in ok if (t := r.tpot_s) is not None]),
        itl_ms=_dist_ms([x for r in ok for x in r.itl_s]),
        e2e_ms=_dist_ms([r.latency_s for r in ok if r.latency_s is not None]),
        accept_len=statistics.fmean(metas) if metas else None,
        accept_source="meta" if metas else "",
        **_energy_fields(energy, tokens),
        **_slo_fields(results, wall_s, slo_ttft_ms, slo_tpot_ms),
    )


def _energy_fields(energy: EnergyReading | None, tokens: int) -> dict[str, Any]:
    if energy is None:
        return {"energy": None, "energy_note": NOT_MEASURED}
    data = energy.to_json(tokens)
    return {"energy": data, "energy_note": "" if data is not None else energy.note}


def _slo_fields(results: Sequence[RequestResult], wall_s: float, ttft_ms: float | None,
                tpot_ms: float | None) -> dict[str, Any]:
    if ttft_ms is None and tpot_ms is None:
        return {"slo": None, "slo_met": None, "goodput_rps": None}
    met = sum(1 for r in results if meets_slo(r, ttft_ms, tpot_ms))
    return {"slo": {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms}, "slo_met": met,
            "goodput_rps": met / wall_s if wall_s > 0 and any(r.ok for r in results) else None}


def _number(value: Any) -> float | None:
    """A stored figure: a finite int or float as it is (an int stays an int, so the JSON reads back the same)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _count(value: Any) -> int:
    """A stored count: an int >= 0, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _dist(value: Any) -> dict[str, float | None]:
    """A stored {"p50", "p90", "p99", "mean"} in ms, each None when not measured (or not a finite number)."""
    got = value if isinstance(value, Mapping) else {}
    return {k: _number(got.get(k)) for k in ("p50", "p90", "p99", "mean")}


def _usable_energy(energy: Any) -> bool:
    """A stored `energy` that summary_lines can print: its method, joules, GPUs and the watts per GPU."""
    if not isinstance(energy, Mapping):
        return False
    watts = energy.get("mean_w_per_gpu")
    return (isinstance(energy.get("method"), str) and _number(energy.get("joules")) is not None
            and isinstance(energy.get("gpus"), int) and not isinstance(energy.get("gpus"), bool)
            and isinstance(watts, list) and all(_number(w) is not None for w in watts)
            and all(energy.get(k) is None or _number(energy.get(k)) is not None
                    for k in ("j_per_token", "tokens_per_j")))


def summary_lines(summary: BenchSummary) -> list[str]:
    """The energy and goodput lines of a bench summary, for the CLI and the dashboard."""
    lines = []
    energy = summary.energy
    if energy:
        per_gpu = ", ".join(f"{w:.1f}" for w in energy["mean_w_per_gpu"])
        j_tok, tok_j = energy.get("j_per_token"), energy.get("tokens_per_j")
        lines.append(
            f"energy ({METHOD_TEXT.get(energy['method'], energy['method'])}): {energy['joules']:.1f} J on "
            f"{energy['gpus']} GPU{'s' if energy['gpus'] != 1 else ''}, mean {per_gpu} W per GPU; "
            f"{'n/a' if j_tok is None else f'{j_tok:.4g}'} J/token, "
            f"{'n/a' if tok_j is None else f'{tok_j:.4g}'} tokens/J")
    else:
        lines.append(f"energy: unavailable ({summary.energy_note or NOT_MEASURED})")
    slo = summary.slo
    if slo:
        limits = " and ".join(f"{name} <= {value:g} ms" for name, value in (("TTFT", slo.get("ttft_ms")),
                                                                              ("TPOT", slo.get("tpot_ms")))
                              if value is not None)
        goodput, rate = summary.goodput_rps, summary.request_rate
        lines.append(
            f"goodput: {'n/a' if goodput is None else f'{goodput:.3g}'} req/s within {limits} "
            f"({summary.slo_met} of {summary.requests} requests); throughput "
            f"{'n/a' if rate is None else f'{rate:.3g}'} req/s")
    return lines


@dataclass
class BenchResult:
    """One run's requests (warm-up excluded) and its summary."""

    spec: BenchSpec
    results: list[RequestResult]
    wall_s: float
    summary: BenchSummary


async def _send_all(
    session: StreamPool,
    base_url: str,
    model: str,
    spec: BenchSpec,
    prompts: list[str],
    on_result: Callable[[int, RequestResult], None] | None,
) -> tuple[list[RequestResult], float]:
    """Send every prompt at spec.concurrency on `session`'s kept connections; the results in prompt order and the
    wall time. The requests are built before the clock starts; `concurrency` workers take the next index."""
    chat = spec.endpoint == "chat"
    requests = [completion_request(base_url, model, prompt, spec.max_tokens, chat=chat, ignore_eos=spec.ignore_eos)
                for prompt in prompts]
    results: list[RequestResult | None] = [None] * len(requests)
    next_index = 0
    started = time.monotonic()

    async def worker() -> None:
        nonlocal next_index
        while next_index < len(requests):
            i = next_index
            next_index += 1
            result = await stream_completion(session, requests[i], run_started=started)
            results[i] = result
            if on_result is not None:
                on_result(i, result)

    try:  # the workers end with this call: a TaskGroup, which cancels the others when one fails
        async with asyncio.TaskGroup() as group:
            for _ in range(max(1, min(spec.concurrency, len(requests)))):
                group.create_task(worker())
    except BaseExceptionGroup as failed:  # the first failure, as the callers expect it (a listener's error)
        raise failed.exceptions[0] from None
    wall = time.monotonic() - started
    return [r for r in results if r is not None], wall


async def run_bench(
    base_url: str,
    model: str,
    spec: BenchSpec,
    *,
    on_result: Callable[[int, RequestResult], None] | None = None,
    on_warmup_done: Callable[[], None] | None = None,
    stall_timeout_s: float = STALL_TIMEOUT_S,
    energy: EnergyMeter | None = None,
) -> BenchResult:
    """Warm up (excluded), then send spec.requests requests at spec.concurrency; returns every result.

    `energy` is started after the warm-up and stopped when the last measured request ends (its reading goes
    into the summary: `energy`, `energy_note`).

    A bad answer (an HTTP error, a broken chunk, a stream silent for `stall_timeout_s`) is an error result of its
    kind (BenchSummary.error_kinds), never an exception out of the run.
    """
    prompts = build_prompts(spec, spec.requests, offset=spec.warmup)
    async with StreamPool(base_url, spec.concurrency, connect_s=5, stall_s=stall_timeout_s,
                          total_s=spec.timeout_s) as session:
        if spec.warmup > 0:
            warm = replace(spec, requests=spec.warmup)
            await _send_all(session, base_url, model, warm, build_prompts(spec, spec.warmup), None)
        if on_warmup_done is not None:
            on_warmup_done()
        if energy is not None:
            await energy.start()
        try:
            results, wall = await _send_all(session, base_url, model, spec, prompts, on_result)
        finally:
            reading = await energy.stop() if energy is not None else None
    summary = summarize(results, wall, slo_ttft_ms=spec.slo_ttft_ms, slo_tpot_ms=spec.slo_tpot_ms, energy=reading)
    return BenchResult(spec, results, wall, summary)
