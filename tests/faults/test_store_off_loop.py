"""The history's SQLite waits for another writer's lock in a thread worker, never on the event loop (issue 25, item
4): SQLite's busy wait (10 s) is longer than the driver lock's stale limit (5 s), so a wait on the loop would stall
the heartbeat and the screen. Here the other writer lets go from a callback on the same loop: a write that held
the loop would wait its whole busy timeout for a release that cannot run, and fail with "database is locked"."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from app.connect import host_for
from app.core.data import ServerState
from app.core.measure.bench import BenchSpec
from app.core.measure.recorded import run_recorded_bench
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import load_profile
from app.core.session import Session
from tests.helpers import MakeProfile


def _hold(path: Path) -> sqlite3.Connection:
    """Another writer (a second tunedash) holding the history's write lock."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    return other


async def test_a_recorded_bench_waits_for_a_locked_history_without_holding_the_loop(
        make_profile: MakeProfile, tmp_path: Path) -> None:
    profile = load_profile(make_profile(startup_s=0.3))
    session = Session(host_for(profile), profile)
    await session.start()
    store = HistoryStore(tmp_path / "history.sqlite3")
    try:
        await session.launch()
        assert await session.lifecycle.wait_ready(30) == ServerState.READY
        other = _hold(store.path)
        asyncio.get_running_loop().call_later(1.0, other.rollback)  # the other writer lets go, on this loop
        url = await session.host.http_base(profile.port)
        spec = BenchSpec(requests=4, concurrency=2, input_len=16, max_tokens=8, warmup=0)
        recorded = await run_recorded_bench(url, profile, spec, host_name=session.host.name,
                                            running_flags=profile.flags, store=store)
        assert recorded.run_id is not None
        stored = store.run(recorded.run_id)
        assert stored is not None and stored.status == "done" and len(stored.trials) == 1
        other.close()
    finally:
        store.close()
        await session.lifecycle.kill(confirm_free=False)
        await session.stop()


async def test_a_store_call_in_a_thread_lets_the_loop_release_the_lock(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "history.sqlite3")
    try:
        other = _hold(store.path)
        asyncio.get_running_loop().call_later(0.5, other.rollback)
        run_id = await store.in_thread(store.start_run, "bench", profile="p", host="h", backend="sglang",
                                       model="m", params={})
        await store.in_thread(store.finish_run, run_id, "done")
        runs = await store.in_thread(store.runs)
        assert [(run.id, run.status) for run in runs] == [(run_id, "done")]
        other.close()
    finally:
        store.close()
