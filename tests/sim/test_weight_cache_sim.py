"""The simulated 0.5.23 weight cache daemon and its clients: the daemon holds the weights' MiB per GPU and writes
the real ready files; a client loads from it in a fraction of the disk time with the real lines; no daemon is a
disk fallback, a CacheConfig mismatch the real error; a client whose daemon died exits; the seed timing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.sim.server_args import load_models
from app.sim.sglang import SEED_PHASES, phase_seconds
from app.sim.versions import VERSION_ENV
from app.sim.weight_cache import sim_tmp
from tests.helpers import GroupReaper, smi, wait_until

from .test_sglang_server import Server, free_port

MODEL = load_models()["sim/qwen3.6-27b"]
WEIGHTS_MIB_PER_GPU = MODEL["weights_gib"] * 1024 / 2


@pytest.fixture
def env(sim_env: dict[str, str]) -> dict[str, str]:
    return {**sim_env, VERSION_ENV: "0.5.23", "TUNEDASH_SIM_STARTUP_S": "1.0"}


class Daemon:
    """`python -m app.sim.weight_cache` in its own process group."""

    def __init__(self, reaper: GroupReaper, env: dict[str, str], log: Path, *flags: str) -> None:
        self.log = log
        argv = [sys.executable, "-m", "app.sim.weight_cache", "--model-path", "sim/qwen3.6-27b", "--tp-size", "2",
                *flags]
        with log.open("w") as fh:
            self.proc = reaper.start(argv, env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def text(self) -> str:
        return self.log.read_text()

    def wait_ready(self, timeout: float = 20) -> None:
        wait_until(lambda: "weight cache daemons on node 0 are ready" in self.text() or self.proc.poll() is not None,
                   timeout, "the daemons' ready line", self.text)
        assert self.proc.poll() is None, self.text()

    def pids(self) -> list[int]:
        return [int(p) for p in re.findall(r"Launched weight cache daemon gpu=\d pp_rank=0 tp_rank=\d pid=(\d+)",
                                           self.text())]


def apps(env: dict[str, str]) -> list[tuple[int, str, int]]:
    out = smi(env, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits").stdout
    rows = [line.split(", ") for line in out.splitlines() if line.strip()]
    return [(int(p), n, int(m)) for p, n, m in rows]


def test_the_daemon_holds_the_weights_per_gpu_and_writes_ready_files(env: dict[str, str], tmp_path: Path,
                                                                     reaper: GroupReaper,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEDASH_SIM_STATE", env["TUNEDASH_SIM_STATE"])
    daemon = Daemon(reaper, env, tmp_path / "daemon.log")
    daemon.wait_ready()
    text = daemon.text()
    assert len(daemon.pids()) == 2
    assert "Weight cache daemon pp_rank=0 tp_rank=1 is ready" in text
    assert "All 2 weight cache daemons on node 0 are ready (pp_ranks=0..0, tp_ranks=0..1, dist_init_method=tcp://" \
        in text
    assert re.search(r"\d{4}-\d\d-\d\d [\d:,]+ \[Daemon gpu=1 tp_rank=1\] INFO \[WeightCacheDaemon gpu=1 "
                     r"tp_rank=1\] Model loaded from disk in [\d.]+s", text), text
    ready = sorted(sim_tmp().glob("sglang_weight_cache_*.ready"))
    assert len(ready) == 2 and len(list(sim_tmp().glob("*.sock"))) == 2
    first = ready[0].read_text().splitlines()
    assert first[0].startswith("pid=") and int(first[0][4:]) in daemon.pids()
    assert first[1].startswith("config={'model_path': 'sim/qwen3.6-27b'")
    held = {pid: mib for pid, name, mib in apps(env) if name == "python3"}
    assert set(held) == set(daemon.pids())
    assert all(mib >= WEIGHTS_MIB_PER_GPU - 4 for mib in held.values()), held


def test_a_second_daemon_on_the_same_gpus_is_refused(env: dict[str, str], tmp_path: Path,
                                                     reaper: GroupReaper) -> None:
    Daemon(reaper, env, tmp_path / "one.log").wait_ready()
    second = Daemon(reaper, env, tmp_path / "two.log")
    assert second.proc.wait(timeout=20) == 1
    assert "is already running (pid=" in second.text() and "Stop the existing daemon" in second.text()


def test_a_client_loads_from_the_daemon_in_a_fraction_of_the_disk_time(env: dict[str, str], tmp_path: Path,
                                                                       reaper: GroupReaper) -> None:
    daemon = Daemon(reaper, env, tmp_path / "daemon.log")
    daemon.wait_ready()
    srv = Server(reaper, env, tmp_path / "client.log", "--weight-cache-mode", "client", "--mem-fraction-static",
                 "0.88")
    srv.wait_ready()
    text = srv.text()
    assert "[IpcModelLoader] Requesting weights from daemon at" in text
    assert "[IpcModelLoader] Loaded model via IPC (mode=client), total=" in text
    for pid in daemon.pids():
        assert f"[IpcModelLoader] Started daemon-liveness watchdog for pid={pid}" in text
    elapsed = [float(s) for s in re.findall(r"Load weight end\. elapsed=([\d.]+) s", text)]
    disk = phase_seconds(1.0)["weights"]
    assert len(elapsed) == 2 and max(elapsed) < disk / 3, (elapsed, disk)
    assert "mem usage=0.00 GB" in text
    # The engine's ranks hold their KV pool, not the weights: the daemons still hold those (both fit on a GPU).
    ranks = {pid: mib for pid, name, mib in apps(env) if name.startswith("sglang::")}
    assert len(ranks) == 2 and all(mib < 49140 - WEIGHTS_MIB_PER_GPU for mib in ranks.values()), ranks


def test_without_a_daemon_the_client_falls_back_to_disk(env: dict[str, str], tmp_path: Path,
                                                        reaper: GroupReaper) -> None:
    srv = Server(reaper, env, tmp_path / "client.log", "--weight-cache-mode", "client")
    srv.wait_ready()
    text = srv.text()
    assert "[IpcModelLoader] Daemon socket not found at " in text
    assert "[IpcModelLoader] Weight cache not available or config mismatch, falling back to disk load" in text
    assert "Loaded model via IPC" not in text


def test_a_cache_key_mismatch_is_the_real_error(env: dict[str, str], tmp_path: Path, reaper: GroupReaper) -> None:
    daemon = Daemon(reaper, env, tmp_path / "daemon.log")
    daemon.wait_ready()
    srv = Server(reaper, env, tmp_path / "client.log", "--weight-cache-mode", "client", "--dtype", "float16")
    assert srv.proc.wait(timeout=20) != 0
    assert "RuntimeError: [IpcModelLoader] Daemon config mismatch!" in srv.text()
    assert "Received sigquit from a child process" in srv.text()
    assert "Config mismatch: {'dtype': ('torch.bfloat16', 'torch.float16')}" in daemon.text()


def test_the_engine_exits_when_its_daemon_dies(env: dict[str, str], tmp_path: Path, reaper: GroupReaper) -> None:
    daemon = Daemon(reaper, env, tmp_path / "daemon.log")
    daemon.wait_ready()
    srv = Server(reaper, env, tmp_path / "client.log", "--weight-cache-mode", "client")
    srv.wait_ready()
    import os
    import signal

    os.killpg(daemon.proc.pid, signal.SIGKILL)  # the whole daemon group: this test started it
    assert srv.proc.wait(timeout=20) != 0, srv.text()
    text = srv.text()
    assert "died while this engine holds its weights via CUDA IPC" in text
    assert re.search(r"Subprocess scheduler_\d \(pid=\d+\) crashed with exit code -9\. Triggering SIGQUIT", text)
    wait_until(lambda: not apps(env), 10, "the GPUs without processes", lambda: str(apps(env)))


def test_weight_cache_with_speculation_is_refused_as_0523_does(env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "app.sim.sglang", "--model-path", "sim/qwen3.6-27b",
                           "--port", str(free_port()), "--weight-cache-mode", "client", "--speculative-algorithm",
                           "NEXTN"], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1
    assert "ValueError: --weight-cache-mode is not supported together with speculative decoding" in done.stderr


def test_seed_timing_plays_the_real_phase_times(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEDASH_SIM_TIMING", "seed")
    phases = phase_seconds(0.3)
    assert phases["weights"] == 31.1 and phases["graph"] + phases["piecewise"] == pytest.approx(16.3)
    assert phases["ipc_weights"] < 1.0
    assert sum(SEED_PHASES.values()) - SEED_PHASES["draft_graph"] == pytest.approx(58.0)
    monkeypatch.delenv("TUNEDASH_SIM_TIMING")
    assert phase_seconds(1.0)["weights"] == pytest.approx(0.45)
    assert json.dumps(phase_seconds(1.0))


def test_a_cache_miss_and_a_dead_daemon_are_named_by_the_parser_and_the_advisor(env: dict[str, str],
                                                                                 tmp_path: Path,
                                                                                 reaper: GroupReaper) -> None:
    from app.core.advisor.evidence import Evidence
    from app.core.advisor.rules import check_weight_cache_miss
    from app.core.data import FatalEvent, Notice
    from app.core.logs.parser import parse_lines, read_log_lines

    srv = Server(reaper, env, tmp_path / "miss.log", "--weight-cache-mode", "client")
    srv.wait_ready()
    events = parse_lines(list(read_log_lines(srv.log))).events
    notices = tuple(e for e in events if isinstance(e, Notice))
    miss = [n for n in notices if n.feature == "weight_cache"]
    assert miss and miss[0].kind == "warning"
    verdict = check_weight_cache_miss(Evidence(backend="sglang", requested={}, notices=notices))
    assert verdict is not None and verdict.what == "the weights came from disk, not from the weight cache daemon"
    assert "falling back to disk load" in verdict.evidence[0]

    died = ("[2026-12-02 01:00:00 TP0] [IpcModelLoader] Weight cache daemon (pid=4242) died while this engine holds "
            "its weights via CUDA IPC. The mapped weight pointers are now dangling; continuing would read freed GPU "
            "memory. Terminating this process.\n")
    fatal = [e for e in parse_lines([died]).events if isinstance(e, FatalEvent)]
    assert [f.kind for f in fatal] == ["weight_cache_died"]
