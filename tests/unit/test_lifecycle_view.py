"""The frozen LifecycleView holds copies: what a screen or an A/B holds never changes under it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.connect import host_for
from app.core.profiles.loading import load_profile
from app.core.server.jobs import JobRecord
from app.core.server.lifecycle import ServerLifecycle
from app.core.session import Session
from app.core.telemetry.smi import telemetry_for


def _record() -> JobRecord:
    return JobRecord(profile="t", host="sim", backend="sglang", model="m", port=30000, argv=["python", "-m", "s"],
                     flags={"x": 1}, pid=123, pgid=123, start_time="1", log_path="/tmp/t.log", launched_by="me",
                     launched_at=1.0, gpus=[0], phase_times={"load": 1.0}, outcome="running")


def test_a_view_keeps_what_it_saw_while_the_lifecycle_writes_on(make_profile: Callable[..., Path]) -> None:
    profile = load_profile(str(make_profile()))
    host = host_for(profile)
    lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))
    lifecycle.record = _record()
    for owner in (lifecycle, Session(host, profile, telemetry=lifecycle.telemetry)):
        if isinstance(owner, Session):
            owner.lifecycle.record = _record()
            live = owner.lifecycle
        else:
            live = owner
        view = owner.view()
        assert live.record is not None and view.record is not live.record and view.record == live.record
        # what the lifecycle does to its own as the server becomes ready (lifecycle._became_ready)
        live.record.outcome = "ready"
        live.record.phase_times["ready"] = 2.0
        live.record.flags["x"] = 3
        view.phase_times["kill"] = 9.0  # a fresh dict per view: a reader's change stays its own
        assert view.record.outcome == "running" and view.record.phase_times == {"load": 1.0}
        assert view.record.flags == {"x": 1} and "kill" not in live.phase_times


def test_a_record_copy_shares_no_list_or_dict_with_the_original() -> None:
    """JobRecord.copy (what a view holds, instead of copy.deepcopy): every list and dict new, a flag's list too."""
    record = _record()
    record.flags["cuda-graph-bs"] = [1, 2, 4]
    record.baseline_mib = {"0": 5}
    copied = record.copy()
    assert copied == record
    record.argv.append("--more")
    record.flags["cuda-graph-bs"].append(8)
    record.gpus.append(1)
    record.baseline_mib["0"] = 7
    record.phase_times["ready"] = 2.0
    assert copied.argv == ["python", "-m", "s"] and copied.flags == {"x": 1, "cuda-graph-bs": [1, 2, 4]}
    assert copied.gpus == [0] and copied.baseline_mib == {"0": 5} and copied.phase_times == {"load": 1.0}
