"""The simulated server's decode loop: requests, continuous batching at the speed model's pace, Decode lines.

The Prefill and Decode lines have the shape of the release spoken (scheduler_components/metrics_reporter.py
of 0.5.23 adds `#pending-token` to the Prefill line); hybrid (mamba) models log `#full token`/`mamba usage`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from app.sim.gpu_state import write_load
from app.sim.resolved import Running
from app.sim.simlog import log
from app.sim.speed import SpeedModel

MIN_SLEEP_S = 0.001
"""The shortest step wait slept as a timer (asyncio's epoll wakes in whole milliseconds); shorter ones yield."""

WORDS = (
    " the", " GPU", " memory", " is", " free", " and", " the", " server", " decodes", " tokens", " quickly",
    " while", " the", " draft", " model", " proposes", " several", " steps", " ahead", ".",
)


@dataclass
class SimRequest:
    """One generation request in flight."""

    rid: str
    prompt_tokens: int
    max_tokens: int
    generated: int = 0
    verify_rounds: int = 0
    chunks: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    done: bool = False


@dataclass
class EngineStats:
    """Counters for /get_server_info and /metrics."""

    last_gen_throughput: float = 0.0
    total_verify_rounds: int = 0
    total_accepted: int = 0  # tokens produced in rounds (incl. bonus)
    generation_tokens_total: int = 0
    prompt_tokens_total: int = 0
    num_requests_total: int = 0
    realtime_decode_tokens: int = 0
    running: int = 0
    queued: int = 0
    used_tokens: int = 0


class Engine:
    """Continuous batching over SimRequests; prints Prefill/Decode lines with the TP0 prefix."""

    def __init__(self, args: dict[str, Any], running: Running, speed: SpeedModel, max_total_tokens: int,
                 busy_file: str | None) -> None:
        self.args = args
        self.setup = running  # what runs (graphs, overlap, mamba), not the running requests
        self.speed = speed
        self.max_total_tokens = max(max_total_tokens, 1)
        self.busy_file = busy_file
        self.prefix = " TP0" if args["tp_size"] > 1 else ""
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.stats = EngineStats()
        self.wake = asyncio.Event()
        self.spec = bool(args.get("speculative_algorithm"))
        self.hybrid = running.mamba
        self._word = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def in_flight(self) -> int:
        return len(self.waiting) + len(self.running)

    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)
        self.stats.num_requests_total += 1
        self.stats.prompt_tokens_total += req.prompt_tokens
        self.wake.set()

    def abort(self, req: SimRequest) -> None:
        for q in (self.waiting, self.running):
            if req in q:
                q.remove(req)
        req.done = True

    def _text(self, n: int) -> str:
        out = []
        for _ in range(n):
            out.append(WORDS[self._word % len(WORDS)])
            self._word += 1
        return "".join(out)

    def _usage_part(self) -> str:
        used = sum(r.prompt_tokens + r.generated for r in self.running)
        self.stats.used_tokens = used
        usage = used / self.max_total_tokens
        if self.hybrid:
            mamba = len(self.running)
            cap = max(self.setup.max_mamba_cache_size, 1)
            return (f"#full token: {used}, full token usage: {usage:.2f}, mamba num: {mamba}, "
                    f"mamba usage: {mamba / cap:.2f}, ")
        return f"#token: {used}, token usage: {usage:.2f}, "

    def _usage_ratios(self) -> str:
        used = sum(r.prompt_tokens + r.generated for r in self.running)
        usage = used / self.max_total_tokens
        if self.hybrid:
            cap = max(self.setup.max_mamba_cache_size, 1)
            return f"full token usage: {usage:.2f}, mamba usage: {len(self.running) / cap:.2f}, "
        return f"token usage: {usage:.2f}, "

    async def _prefill(self) -> None:
        room = self.args["max_running_requests"] - len(self.running)
        new = self.waiting[:room]
        del self.waiting[:room]
        if not new:
            return
        tokens = sum(r.prompt_tokens for r in new)
        p = self.speed.p
        secs = (p["prefill_base_ms"] + p["prefill_ms_per_token"] * tokens) / 1000
        await asyncio.sleep(secs)
        self.running.extend(new)
        graph = "True" if self.setup.prefill_graph else "False"
        pending = "#pending-token: 0, " if self.setup.version == "0.5.23" else ""
        log(
            f"Prefill batch, #new-seq: {len(new)}, #new-token: {tokens}, #cached-token: 0, "
            f"{self._usage_ratios()}"
            f"#running-req: {len(self.running) - len(new)}, #queue-req: {len(self.waiting)}, {pending}"
            f"cuda graph: {graph}, input throughput (token/s): {tokens / secs:.2f}",
            self.prefix,
        )

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = max(int(self.args["decode_log_interval"]), 1)
        steps = 0
        window_tokens = 0
        window_rounds = 0
        window_accepted = 0
        window_start = loop.time()
        last_busy = 0.0
        last_batch = 0
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                window_start = loop.time()
                window_tokens = window_rounds = window_accepted = 0
            if self.waiting:
                await self._prefill()
            batch = len(self.running)
            if batch == 0:
                continue
            t0 = loop.time()
            context = sum(r.prompt_tokens + r.generated for r in self.running) / batch
            wait = self.speed.sample_step_ms(batch, context) / 1000 - (loop.time() - t0)
            # A wait under a millisecond only yields: the event loop's epoll sleeps whole milliseconds, so a
            # near-zero step (bench/bench_loadgen.py's zero-cost speed file) took >= 1 ms and capped the sim.
            await asyncio.sleep(wait if wait >= MIN_SLEEP_S else 0)
            for req in list(self.running):
                n = min(self.speed.sample_accept(), req.max_tokens - req.generated)
                req.generated += n
                req.verify_rounds += 1
                window_tokens += n
                window_rounds += 1
                window_accepted += n
                self.stats.realtime_decode_tokens += n
                self.stats.total_verify_rounds += 1
                self.stats.total_accepted += n
                req.chunks.put_nowait(self._text(n))
                if req.generated >= req.max_tokens:
                    self.running.remove(req)
                    req.done = True
                    req.chunks.put_nowait(None)
                    self.stats.generation_tokens_total += req.generated
            steps += 1
            now = loop.time()
            if self.busy_file and (now - last_busy > 0.5 or (batch != last_batch and now - last_busy > 0.1)):
                last_busy, last_batch = now, batch  # the load behind power.draw (gpu_state.power_draw_w)
                write_load(self.busy_file, batch, 1 + self.speed.draft_tokens)
            self.stats.running = len(self.running)
            self.stats.queued = len(self.waiting)
            if steps % interval == 0:
                elapsed = max(now - window_start, 1e-6)
                self.stats.last_gen_throughput = window_tokens / elapsed
                spec = ""
                if self.spec and window_rounds:
                    accept_len = window_accepted / window_rounds
                    drafts = max(self.speed.draft_tokens, 1)
                    spec = f"accept len: {accept_len:.2f}, accept rate: {(accept_len - 1) / drafts:.2f}, "
                graph = self.speed.uses_cuda_graph(max(batch, 1))
                log(
                    f"Decode batch, #running-req: {batch}, {self._usage_part()}{spec}cuda graph: {graph}, "
                    f"gen throughput (token/s): {self.stats.last_gen_throughput:.2f}, #queue-req: {len(self.waiting)}",
                    self.prefix,
                )
                window_start = now
                window_tokens = window_rounds = window_accepted = 0

    def avg_spec_accept_length(self) -> float | None:
        if not self.spec or self.stats.total_verify_rounds == 0:
            return None
        return self.stats.total_accepted / self.stats.total_verify_rounds

