"""The parallel-slot tests' helpers (tests/integration/test_tune_slots_sim.py, tests/ui/test_tune_slots_screen.py): a
simulated 8-GPU host like profiles/demo-8gpu.toml's in a test's folder, consecutive free ports, and a watch of the
sim's allocations and job records that records every GPU or port two servers hold at once."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

from tests.helpers import REPO


def consecutive_free_ports(n: int) -> int:
    """A base port with base .. base + n - 1 all free right now."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = int(sock.getsockname()[1])
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise AssertionError(f"no {n} consecutive free ports")


def write_8gpu_profile(folder: Path, tune: str, *, name: str = "s8", port: int | None = None) -> tuple[Path, Path]:
    """(profile file, sim state) of an 8-GPU simulated host like demo-8gpu's (GPUs 6-7 slower), in `folder`, with a
    0.3 s startup, four free ports from its own (or from `port`) and the [bench]/[tune] tables `tune` instead of
    the demo's. The caller kills what it launched (tests.helpers.kill_launched(state))."""
    state = folder / f"{name}-sim"
    text = (Path(REPO) / "profiles" / "demo-8gpu.toml").read_text()
    out = []
    for line in text.splitlines():
        if line.startswith("name ="):
            line = f'name = "{name}"'
        elif line.startswith("sim_state ="):
            line = f'sim_state = "{state}"'
        elif line.startswith("port ="):
            line = f"port = {consecutive_free_ports(4) if port is None else port}"
        elif line.startswith("[env]"):
            line = '[env]\nTUNEDASH_SIM_STARTUP_S = "0.3"'
        elif line.startswith("[bench]"):
            break
        out.append(line)
    profile = folder / f"{name}.toml"
    profile.write_text("\n".join(out) + "\n" + tune)
    return profile, state


def alive(pid: int) -> int | None:
    """The process group of `pid`, or None when it is gone."""
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def held_gpus(state: Path) -> set[int]:
    """The simulated GPUs a live process holds now (the sim's allocations)."""
    try:
        records = json.loads((state / "allocations.json").read_text()).get("records", [])
    except (OSError, ValueError):
        return set()
    return {int(r["gpu"]) for r in records if alive(int(r["pid"])) is not None and not r.get("dead_since")}


class Watch:
    """Samples the sim's allocations and job records every 20 ms while a tune runs; records every overlap."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.problems: list[str] = []
        self.samples = 0
        self.most_servers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _read(self, path: Path) -> object:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self.sample()

    def sample(self) -> None:
        data = self._read(self.state / "allocations.json")
        records = data.get("records", []) if isinstance(data, dict) else []
        by_gpu: dict[int, set[int]] = {}
        for r in records:
            pgid = alive(int(r["pid"]))
            if pgid is not None and not r.get("dead_since"):
                by_gpu.setdefault(int(r["gpu"]), set()).add(pgid)
        for gpu, groups in by_gpu.items():
            if len(groups) > 1:
                self.problems.append(f"GPU {gpu} held by servers {sorted(groups)} at once")
        ports: dict[int, str] = {}
        gpus_of: dict[int, tuple[str, set[int]]] = {}
        for f in (self.state / "host" / "jobs").glob("*.json"):
            rec = self._read(f)
            if not isinstance(rec, dict) or rec.get("pgid") is None or alive(int(rec["pid"])) is None:
                continue
            if rec["port"] in ports:
                self.problems.append(f"port {rec['port']} named by {ports[rec['port']]} and {rec['profile']}")
            ports[rec["port"]] = rec["profile"]
            gpus_of[int(rec["pgid"])] = (rec["profile"], set(rec["gpus"]))
        for gpu, groups in by_gpu.items():
            for g in groups:
                if g in gpus_of and gpu not in gpus_of[g][1]:
                    self.problems.append(f"{gpus_of[g][0]} holds GPU {gpu}, not one of its {sorted(gpus_of[g][1])}")
        self.samples += 1
        self.most_servers = max(self.most_servers, len(ports))
