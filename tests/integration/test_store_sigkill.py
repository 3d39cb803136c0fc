"""The history database after a SIGKILL mid-write (a real writer process): every committed trial is intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from app.core.measure.store import DATA_DIR_ENV, HistoryStore

WRITER = """
import sys, time
from app.core.measure.store import HistoryStore
from app.core.measure.client import RequestResult
store = HistoryStore()
rid = store.start_run("ab", profile="p", host="h", backend="sglang", model="m", params={}, arms=[("A", "", {})])
reqs = [RequestResult(ok=True, output_tokens=8, ttft_s=0.01, latency_s=0.1) for _ in range(200)]
i = 0
while True:
    store.add_trial(rid, 0, i, value=float(i), summary={"i": i}, accept_len=None, accept_source="", requests=reqs)
    print(i, flush=True)
    i += 1
"""


def test_sigkill_mid_write_keeps_every_committed_trial_intact(tmp_path):
    env = {**os.environ, DATA_DIR_ENV: str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER], env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        printed = -1
        deadline = time.monotonic() + 30
        while printed < 20 and time.monotonic() < deadline:
            printed = int(proc.stdout.readline())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with HistoryStore(tmp_path / "history.sqlite3") as store:
        assert store.integrity_ok()
        run = store.runs()[0]
        assert run.status == "running"  # never finished: reads as interrupted
        detail = store.run(run.id)
        assert detail is not None
        values = detail.values(0)
        assert len(values) >= printed + 1  # everything reported as written is there
        assert values == [float(i) for i in range(len(values))]
        assert len(store.request_rows(run.id)) == 200 * len(values)  # no half-written trial
