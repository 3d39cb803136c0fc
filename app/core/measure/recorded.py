"""The one recorded benchmark: run a BenchSpec against the running server and write it to the history.

`tunedash bench` and the dashboard's `b` key both come here, so both record the same fields: the host's name
(as the Host calls itself), the flags of the server that runs (its job record's, when there is one), the
request set, one trial with its summary, the acceptance length and where it came from. A run cancelled
part-way is finished as "cancelled"; one whose writer dies keeps "running" and reads as "interrupted"
(RunRow.shown_status).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from app.core.flags.catalog import FlagValue
from app.core.measure.acceptance import AcceptanceMeter
from app.core.measure.bench import BenchResult, BenchSpec, BenchSummary, run_bench
from app.core.measure.client import RequestResult
from app.core.measure.store import HistoryStore
from app.core.profiles.types import Profile
from app.core.telemetry.energy import EnergyMeter

# Feeds the meter server log events (DecodeStats with accept len); returns the function that stops feeding.
EventFeed = Callable[[Callable[[object], None]], Callable[[], None]]


@dataclass(frozen=True)
class RecordedBench:
    """A finished recorded benchmark: its history id, every request, and the summary as stored."""

    run_id: int | None
    result: BenchResult
    summary: BenchSummary  # the run's, with the acceptance meter's accept_len and accept_source (as stored)


async def run_recorded_bench(
    base_url: str,
    profile: Profile,
    spec: BenchSpec,
    *,
    host_name: str,
    running_flags: Mapping[str, FlagValue],
    store: HistoryStore | None,
    events: EventFeed | None = None,
    on_result: Callable[[int, RequestResult], None] | None = None,
    on_warmup_done: Callable[[], None] | None = None,
    energy: EnergyMeter | None = None,
) -> RecordedBench:
    """Benchmark the server at base_url and record it (when a store is given). The caller closes the store.
    `energy` measures the GPUs over the measured requests (summary "energy", "energy_note")."""
    meter = AcceptanceMeter(profile.backend, base_url)
    stop_feed = events(lambda event: meter.feed(event)) if events is not None else None
    run_id = None
    if store is not None:
        run_id = await store.in_thread(store.start_run, "bench", profile=profile.name, host=host_name,
                                       backend=profile.backend, model=profile.model,
                                       params={"bench": spec.to_json(), "trials": 1},
                                       arms=[("running", "", dict(running_flags))])
    status = "cancelled"
    summary: BenchSummary | None = None
    try:
        await meter.start()
        result = await run_bench(base_url, profile.model, spec, on_result=on_result, on_warmup_done=on_warmup_done,
                                 energy=energy)
        accept, source = await meter.stop(result.summary.accept_len)
        summary = replace(result.summary, accept_len=accept, accept_source=source)
        if store is not None and run_id is not None:
            await store.in_thread(store.add_trial, run_id, 0, 0, value=result.summary.output_tok_s,
                                  summary=summary.to_json(),
                                  accept_len=accept, accept_source=source, requests=result.results)
        status = "done"
    finally:
        if stop_feed is not None:
            stop_feed()
        if store is not None and run_id is not None:
            await store.in_thread(store.finish_run, run_id, status,
                                  summary=None if summary is None else summary.to_json())
    return RecordedBench(run_id, result, summary)
