"""Numbers from records and history rows are range-checked where they are read (issue 19): a record with
`launched_at: 1e300` is a clear error naming its file; a bad history row is skipped and counted ("1 unreadable
history row skipped"), never a traceback, in `history`, `export`, the advisor and the history screen's reads."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.core.advisor.history import recorded_arms
from app.core.measure.store import HistoryStore, StoreError
from tests.helpers import REPO, MakeProfile, tunedash

BENCH = {"concurrency": 1, "input_len": 16, "max_tokens": 32, "endpoint": "completions", "prompt_file": None,
         "ignore_eos": True}


def test_status_of_a_record_launched_at_1e300_names_the_file(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = make_profile()
    assert tunedash("launch", str(profile), "--wait", "--timeout", "60").returncode == 0
    record_file = next((sim_state / "host" / "jobs").glob("t-*.json"))
    record_file.write_text(json.dumps({**json.loads(record_file.read_text()), "launched_at": 1e300}))

    for args in (["status", str(profile)], ["status", str(profile), "--json"]):
        status = tunedash(*args, timeout=60)
        assert status.returncode == 2, status.stdout + status.stderr
        assert "Traceback" not in status.stderr
        assert str(record_file) in status.stderr and "launched_at" in status.stderr
        assert "remove the file or launch again" in status.stderr


def _request(ok: bool = True) -> SimpleNamespace:
    return SimpleNamespace(ok=ok, output_tokens=32, ttft_s=0.1, latency_s=0.9, tpot_s=0.025, start_s=0.0,
                           usage_missing=False, error=None)


@pytest.fixture
def history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A history with three bench runs, run 1 with a start time of 1e300 and run 3 with a trial whose summary is
    not JSON and one request whose latency is text: what a hand edit or another tool leaves."""
    monkeypatch.setenv("TUNEDASH_DATA_DIR", str(tmp_path / "data"))
    with HistoryStore() as store:
        for _ in range(3):
            run_id = store.start_run("bench", profile="demo", host="sim", backend="sglang", model="m",
                                     params={"bench": BENCH, "trials": 1}, arms=[("A", "", {"tp-size": 2})])
            for trial in range(2):
                store.add_trial(run_id, 0, trial, value=40.0 + trial, summary={"output_tok_s": 40.0},
                                accept_len=1.8, accept_source="meta", requests=[_request(), _request()])
            store.finish_run(run_id, "done", summary={"output_tok_s": 40.5, "accept_len": 1.8})
        path = store.path
    db = sqlite3.connect(path)
    db.execute("UPDATE runs SET started_at = 1e300 WHERE id = 1")
    db.execute("UPDATE trials SET summary = '{not json' WHERE run_id = 3 AND trial_idx = 1")
    db.execute("UPDATE requests SET latency_s = 'slow' WHERE idx = 0 AND trial_id = "
               "(SELECT id FROM trials WHERE run_id = 3 AND trial_idx = 0)")
    db.commit()
    db.close()
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ), timeout=60)


def test_history_skips_and_counts_a_bad_row(history: Path) -> None:
    for args in (["history"], ["history", "--json"]):
        listed = _cli(*args)
        assert listed.returncode == 0, listed.stderr
        assert "Traceback" not in listed.stderr
        assert "1 unreadable history row skipped (run #1" in listed.stderr and str(history) in listed.stderr
    runs = json.loads(_cli("history", "--json").stdout)
    assert [r["id"] for r in runs] == [3, 2]


def test_export_skips_and_counts_bad_rows_and_names_an_unreadable_run(history: Path) -> None:
    for fmt in ("md", "csv", "json"):
        exported = _cli("export", "3", "--format", fmt)
        assert exported.returncode == 0, exported.stderr
        assert "Traceback" not in exported.stderr
        assert "unreadable history row" in exported.stderr and "run #3 trial 1" in exported.stderr
    assert json.loads(_cli("export", "2", "--format", "json").stdout)["arms"]  # the good run reads whole
    refused = _cli("export", "1")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "run #1 is unreadable" in refused.stderr and "started_at" not in refused.stdout


def test_the_advisor_and_the_history_screens_reads_skip_bad_rows(history: Path) -> None:
    with HistoryStore() as store:
        arms, _effects = recorded_arms(store, model="m", backend="sglang", hosts=["sim"], bench=BENCH)
        assert sorted(a.run_id for a in arms) == [2, 3]
        listed = store.runs()  # the history screen's list
        assert [r.id for r in listed] == [3, 2]
        run = store.run(3)  # its detail and compare plots
        assert run is not None and [t.trial_idx for t in run.trials] == [0]
        assert len(store.request_rows(3)) == 3  # of 4: the request with text for a latency is left out
        assert store.skipped >= 3 and "unreadable history row" in store.skipped_note()
        with pytest.raises(StoreError, match="run #1 is unreadable"):
            store.run(1)
