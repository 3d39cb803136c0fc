"""The fleet's pure parts: the state rule of a row, its figures, the GPU bars, the table's view, host sharing."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from app.connect import fleet_hosts
from app.core.data import DecodeStats, GpuSample, GpuSnapshot, LogLine, ServerState
from app.core.fleet import FleetPoller, FleetRow, GpuMemory, _state_of, _Watch
from app.core.hosts.base import Host
from app.core.measure.metrics import MetricsRate
from app.core.profiles.loading import load_profile
from app.core.server.jobs import JobRecord
from app.tui.fleet import fleet_row_view, problems_text, short_host
from widgets.fleet_table import FleetRowView, coarse_duration, memory_bars, row_cells, state_cell


def profile_file(folder: Path, name: str, host: str, sim_state: str | None = None) -> Path:
    path = folder / f"{name}.toml"
    state = f'sim_state = "{sim_state}"\n' if sim_state else ""
    path.write_text(f'name = "{name}"\nhost = "{host}"\nbackend = "sglang"\nmodel = "m"\nport = 30000\n'
                    f"gpus = [0, 1]\n{state}")
    return path


def record(outcome: str = "running", pgid: int | None = 4242) -> JobRecord:
    return JobRecord(profile="p", host="sim", backend="sglang", model="m", port=30000, argv=[], flags={}, pid=pgid,
                     pgid=pgid, start_time="1", log_path="/x.log", launched_by="me", launched_at=100.0, gpus=[0],
                     ready_at=120.0, outcome=outcome)  # type: ignore[arg-type]


def test_state_rule_follows_record_liveness_and_log(tmp_path: Path) -> None:
    profile = load_profile(profile_file(tmp_path, "p", "local"))
    watch = _Watch(profile)
    assert _state_of(watch) == ServerState.STOPPED  # no record
    watch.record = record(outcome="launching", pgid=None)
    assert _state_of(watch) == ServerState.LAUNCHING
    watch.record, watch.alive, watch.log_state = record(), True, ServerState.CAPTURING
    assert _state_of(watch) == ServerState.CAPTURING  # alive: the log says where it is
    watch.record, watch.log_state = record(outcome="ready"), ServerState.LAUNCHING
    assert _state_of(watch) == ServerState.READY  # the record says it became ready (a health_url: no log line)
    watch.record = record()
    watch.alive = False
    assert _state_of(watch) == ServerState.CRASHED  # gone on its own
    watch.record = record(outcome="killed")
    assert _state_of(watch) == ServerState.STOPPED  # gone because it was killed


def test_figures_prefer_metrics_then_a_fresh_log_line(tmp_path: Path) -> None:
    profile = load_profile(profile_file(tmp_path, "p", "local"))
    watch = _Watch(profile)
    now = time.time()
    assert FleetPoller._figures(watch, ServerState.READY, now) == (None, None)  # nothing read: no figure, not 0
    watch.decode = DecodeStats(95.0, LogLine(1, "Decode batch"), accept_len=1.7)
    watch.decode_at = now - 5
    assert FleetPoller._figures(watch, ServerState.READY, now) == (95.0, 1.7)
    watch.decode_at = now - 300  # stale: the server may be idle now
    assert FleetPoller._figures(watch, ServerState.READY, now)[0] is None
    watch.rate = MetricsRate(now, 2.0, 0.0, 0.0)
    assert FleetPoller._figures(watch, ServerState.READY, now) == (0.0, None)  # metrics first; idle is a real 0
    assert FleetPoller._figures(watch, ServerState.STOPPED, now) == (None, None)


def test_gpus_are_the_profiles_own_from_the_hosts_snapshot(tmp_path: Path) -> None:
    profile = load_profile(profile_file(tmp_path, "p", "local"))
    snapshot = GpuSnapshot((GpuSample(1, "u1", "A6000", 100, 1000), GpuSample(3, "u3", "A6000", 900, 1000)), 0.0)
    assert FleetPoller._gpus(snapshot, profile) == (GpuMemory(0, None, None), GpuMemory(1, 100, 1000))


def test_memory_bars_and_state_cells() -> None:
    assert memory_bars((0.0, 0.5, 1.0, None)) == "▁▄█·"
    assert memory_bars(()) == "-"
    view = FleetRowView("k", "h", "s", "sglang", ServerState.READY, 1000, 12.4, 1.75, (0.9,), "local", None)
    assert state_cell(view, 1125).plain == "READY 2m"  # whole minutes past the first: redrawn once a minute
    assert state_cell(view, 1042).plain == "READY 42s"
    assert [coarse_duration(s) for s in (59, 3600 + 5 * 60, 2 * 86400 + 4 * 3600)] == ["59s", "1h05m", "2d04h"]
    cells = row_cells(view, 1125)
    assert cells[3:6] == ("12", "1.75", "▇") and cells[7] == "-"  # 0.9 is 7 eighths
    unknown = FleetRowView("k", "h", "s", "sglang", None, None, None, None, (None,), "unreachable", None)
    assert state_cell(unknown, 0).plain == "n/a"
    waiting = FleetRowView("k", "h", "s", "sglang", None, None, None, None, (None,), "connecting", None)
    assert state_cell(waiting, 0).plain == "…"


def test_row_view_and_problems() -> None:
    row = FleetRow(key="/p.toml", profile="p", host="ssh://alice@gpu1:2222", backend="sglang", version="0.5.10",
                   state=ServerState.READY, since=10.7, tokens_per_s=None, accept_len=None,
                   gpus=(GpuMemory(0, 500, 1000), GpuMemory(1, None, None)), gpu_error="",
                   driver="alice@box (dashboard)", connection="connected",
                   error="ssh://alice@gpu1:2222: cannot connect (refused)")
    view = fleet_row_view(row)
    assert (view.host, view.backend, view.since, view.gpu_fractions) == ("gpu1:2222", "sglang 0.5.10", 10, (0.5, None))
    assert view.driver == "alice@box (dashboard)"
    assert short_host("sim") == "sim"
    other = replace(row, profile="q", error="", gpu_error="sh: 1: nvidia-smi: not found")
    text = problems_text([row, replace(row, profile="p2"), other, replace(other, profile="q2")], ["bad: unknown key"])
    assert text.splitlines() == ["p: ssh://alice@gpu1:2222: cannot connect (refused)",  # once per host
                                 "gpu1:2222: GPUs not read: sh: 1: nvidia-smi: not found", "bad: unknown key"]


def test_profiles_on_one_host_share_one_host_object(tmp_path: Path) -> None:
    a = load_profile(profile_file(tmp_path, "a", "ssh://u@gpu1:22"))
    b = load_profile(profile_file(tmp_path, "b", "ssh://u@gpu1:22"))
    c = load_profile(profile_file(tmp_path, "c", "ssh://u@gpu2:22"))
    hosts = [host for _p, host in fleet_hosts([a, b, c])]
    assert all(isinstance(h, Host) for h in hosts)
    assert hosts[0] is hosts[1] and hosts[0] is not hosts[2]
    poller = FleetPoller([(a, hosts[0]), (b, hosts[1]), (c, hosts[2])])  # type: ignore[list-item]
    assert [len(entry.watches) for entry in poller.hosts] == [2, 1]
