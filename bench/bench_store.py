"""The history's cost per trial write: `HistoryStore.add_trial` (one trial with 32 requests) called on the event
loop against the same call through `HistoryStore.in_thread` (a thread worker), which async code uses so that
SQLite's busy wait never stalls the loop (docs/decisions.md#task-owners-and-the-store-off-the-loop).

    python bench/bench_store.py [--runs 5] [--calls 100]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app.core.measure.store import HistoryStore


@dataclass(frozen=True)
class Request:
    """The fields of a RequestResult the store writes."""

    ok: bool = True
    output_tokens: int = 256
    ttft_s: float = 0.1
    latency_s: float = 2.6
    tpot_s: float = 0.01
    start_s: float = 0.0
    usage_missing: bool = False
    error: str | None = None


async def measure(runs: int, calls: int) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as folder:
        store = HistoryStore(Path(folder) / "history.sqlite3")
        run_id = store.start_run("ab", profile="p", host="h", backend="sglang", model="m", params={})
        requests = [Request()] * 32
        trial = {"value": 40.0, "summary": {"output_tok_s": 40.0}, "accept_len": 2.5, "accept_source": "log",
                 "requests": requests}
        on_loop, in_thread = [], []
        for _ in range(runs):
            started = time.perf_counter()
            for i in range(calls):
                store.add_trial(run_id, 0, i, **trial)  # type: ignore[arg-type]
            on_loop.append((time.perf_counter() - started) / calls * 1000)
            started = time.perf_counter()
            for i in range(calls):
                await store.in_thread(store.add_trial, run_id, 0, i, **trial)
            in_thread.append((time.perf_counter() - started) / calls * 1000)
        store.close()
    return on_loop, in_thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    on_loop, in_thread = asyncio.run(measure(args.runs, args.calls))
    loop_ms, thread_ms = statistics.median(on_loop), statistics.median(in_thread)
    print(f"add_trial, 32 requests, median of {args.runs} x {args.calls}: on the loop {loop_ms:.2f} ms, "
          f"in_thread {thread_ms:.2f} ms ({thread_ms / loop_ms:.2f}x)")


if __name__ == "__main__":
    main()
