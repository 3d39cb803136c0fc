"""The simulated GPUs: a state folder of GPU descriptions, per-process allocations and fault knobs.

Stdlib only (the fake nvidia-smi imports this on every call, so it must stay cheap to import).

State folder layout (all JSON, written atomically by rename; mutations under an fcntl lock on `lock`):

    host.json          {"gpus": [{"index", "uuid", "name", "memory_total_mib", "idle_mib",
                        "reserved_mib", "pci_bus_id", "power_limit_w", "compute_cap", "nvlinks"}...],
                        "release_delay_s": 0.3, "driver_version": "580.159.04", "startup_s": null}
    faults.json        fault knobs read by the fake nvidia-smi (see FAULT_KNOBS); absent = no faults
    allocations.json   {"records": [AllocationRecord...]} the memory held right now
    released.jsonl     one JSON line per released record: pid, name, gpu, mib, dead_since, released_at
    lock               fcntl lock file
    bin/nvidia-smi     the wrapper put first on the simulated host's PATH (see host_env.py)

Release semantics (like a real driver tearing a CUDA context down): a record is owned by a real OS process,
identified by pid AND its start time (field 22 of /proc/PID/stat) so a reused pid does not count; a zombie
owner counts as dead. The first reader that sees the owner dead writes `dead_since`; the memory is reported
until `dead_since + release_delay_s` and then released (moved to released.jsonl with
`released_at = dead_since + release_delay_s`). A record flagged `leaked` is never released (a stuck driver
context): it stays, with the dead rank's pid and name, until reset_state().

A GPU's `compute_cap` ("8.6") and `nvlinks` (0: PCIe only) are what `nvidia-smi --query-gpu=compute_cap` and
`nvidia-smi topo -m` print of it; the GPU types a profile's `sim_gpus` names are in gpu_models.py.

Power (what `power.draw` prints; `power_draw_w`): the decoding server writes its load (`write_load`: sequences
in the batch, tokens each sequence puts through the target model per step) into the `busy` file about every
0.5 s; a GPU holding memory whose server wrote it in the last 1.5 s is decoding. The model's assumptions, as
fractions of the GPU's power limit (A6000 300 W, H200 700 W):
  1. no memory held: idle at 7.5 % (A6000 22.5 W); memory held, not decoding: 25 % (clocks up, HBM refresh, a
     polling scheduler; A6000 75 W);
  2. decoding is memory-bound at small batches: a step reads the weights once whatever it computes on them,
     so one token per step already draws 70 % of the way from the held level to the limit;
  3. each further token the target model processes in a step (one more sequence, one more draft token to
     verify) adds arithmetic on weights already read: the draw climbs towards the limit as
     1 - exp(-(tokens - 1) / 32), tokens = batch x tokens per sequence;
  4. so a step's energy grows slowly with what it computes while the tokens it yields grow with the accepted
     drafts: energy per token falls with speculative steps that are accepted and with the batch (the demo at
     concurrency 4: 3 steps 0.73 x the J/token of 1 by the model's means, 0.78 x in a live bench with its
     prefills and tails: docs/decisions.md#energy-per-token);
  5. each reading carries +-1 % gaussian jitter, like a real sensor.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import random
import time

# Kept off the import path on purpose: pathlib, dataclasses, typing and contextlib cost ~30 ms at start-up,
# and the fake nvidia-smi imports this module on every call.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    StrPath = str | os.PathLike[str]

HOST_FILE = "host.json"
FAULTS_FILE = "faults.json"
ALLOC_FILE = "allocations.json"
RELEASED_FILE = "released.jsonl"
LOCK_FILE = "lock"
BUSY_FILE = "busy"  # the decoding server's load (write_load); a recent mtime = the GPUs holding memory are busy
BUSY_FRESH_S = 1.5

IDLE_POWER_FRACTION = 0.075
LOADED_POWER_FRACTION = 0.25
DECODE_FLOOR = 0.7  # share of the way from the loaded draw to the limit at one token per step
DECODE_TOKENS_SCALE = 32.0
POWER_JITTER = 0.01

DEFAULT_GPU_NAME = "NVIDIA RTX A6000"
DEFAULT_TOTAL_MIB = 49140
DEFAULT_RESERVED_MIB = 471
DEFAULT_RELEASE_DELAY_S = 0.3
DEFAULT_DRIVER = "580.159.04"
DEFAULT_COMPUTE_CAP = "8.6"

# Fault knobs (faults.json keys) understood by the fake nvidia-smi:
#   driver_mismatch: bool      -> "Failed to initialize NVML: Driver/library version mismatch", rc 18
#   driver_not_loaded: bool    -> "NVIDIA-SMI has failed because it couldn't communicate ...", rc 9
#   nvml_unknown_error: bool   -> "Failed to initialize NVML: Unknown Error", rc 255
#   no_devices: bool           -> "No devices were found", rc 6
#   lost_gpus: list[int]       -> those GPU indices fell off the bus: one-shot queries print
#                                 "Unable to determine the device handle for GPU <bus>: GPU is lost. ..." (rc 15);
#                                 loop mode prints "[GPU is lost]" in every field of that GPU's rows
#   power_na: list[int]        -> those GPUs' power.draw reads "[N/A]" (a board without a power sensor)
FAULT_KNOBS = ("driver_mismatch", "driver_not_loaded", "nvml_unknown_error", "no_devices", "lost_gpus", "power_na")


class SimGpu:
    """One simulated GPU as described in host.json."""

    __slots__ = (
        "compute_cap", "idle_mib", "index", "memory_total_mib", "name", "nvlinks", "pci_bus_id", "power_limit_w",
        "reserved_mib", "uuid",
    )

    def __init__(
        self,
        index: int,
        uuid: str,
        name: str = DEFAULT_GPU_NAME,
        memory_total_mib: int = DEFAULT_TOTAL_MIB,
        idle_mib: int = 0,
        reserved_mib: int = DEFAULT_RESERVED_MIB,
        pci_bus_id: str = "",
        power_limit_w: float = 300.0,
        compute_cap: str = DEFAULT_COMPUTE_CAP,
        nvlinks: int = 0,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.name = name
        self.memory_total_mib = memory_total_mib
        self.idle_mib = idle_mib
        self.reserved_mib = reserved_mib
        self.pci_bus_id = pci_bus_id
        self.power_limit_w = power_limit_w
        self.compute_cap = compute_cap
        self.nvlinks = nvlinks

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SimGpu) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.uuid)

    def __repr__(self) -> str:
        return f"SimGpu({self.index}, {self.uuid!r}, {self.name!r}, {self.memory_total_mib} MiB)"


class HostConfig:
    """The whole host.json."""

    def __init__(
        self,
        gpus: tuple[SimGpu, ...],
        release_delay_s: float = DEFAULT_RELEASE_DELAY_S,
        driver_version: str = DEFAULT_DRIVER,
        startup_s: float | None = None,  # simulated server startup duration; None = its own default
    ) -> None:
        self.gpus = gpus
        self.release_delay_s = release_delay_s
        self.driver_version = driver_version
        self.startup_s = startup_s


class AllocationRecord:
    """Memory held on one GPU by one OS process for one purpose (phase).

    pid + start_time (field 22 of /proc/PID/stat at allocation time) identify the owner; name is the full
    process name nvidia-smi prints (e.g. "sglang::scheduler_TP0"); phase is "context", "weights", "kv_cache",
    "cuda_graph"...; leaked records are never released; dead_since is the wall time at which a reader first
    saw the owner dead.
    """

    FIELDS = ("gpu", "pid", "start_time", "name", "mib", "phase", "leaked", "dead_since", "allocated_at")

    def __init__(
        self,
        gpu: int,
        pid: int,
        start_time: int,
        name: str,
        mib: int,
        phase: str = "",
        leaked: bool = False,
        dead_since: float | None = None,
        allocated_at: float = 0.0,
    ) -> None:
        self.gpu = gpu
        self.pid = pid
        self.start_time = start_time
        self.name = name
        self.mib = mib
        self.phase = phase
        self.leaked = leaked
        self.dead_since = dead_since
        self.allocated_at = allocated_at

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.FIELDS}

    def __repr__(self) -> str:
        return f"AllocationRecord({self.to_dict()})"


class Snapshot:
    """What the driver reports at one moment: the records still holding memory, and the fault knobs."""

    def __init__(self, config: HostConfig, records: list[AllocationRecord], faults: dict[str, Any]) -> None:
        self.config = config
        self.records = records
        self.faults = faults

    def used_mib(self, gpu: SimGpu) -> int:
        return gpu.idle_mib + sum(r.mib for r in self.records if r.gpu == gpu.index)


def default_gpus(count: int = 2, name: str = DEFAULT_GPU_NAME, total_mib: int = DEFAULT_TOTAL_MIB) -> list[SimGpu]:
    """`count` identical GPUs with stable, distinct UUIDs and PCI bus ids."""
    return [
        SimGpu(
            index=i,
            uuid=f"GPU-{0x5A1D0C3E + i * 0x1111:08x}-6f2b-4e7b-9c21-{0x3B9A6000A6 + i * 0x10101:012x}",
            name=name,
            memory_total_mib=total_mib,
            pci_bus_id=f"00000000:{0x17 + i * 0x48:02X}:00.0",
        )
        for i in range(count)
    ]


# ---------------------------------------------------------------------------------------------- files


def _path(state_dir: StrPath, name: str) -> str:
    return os.path.join(os.fspath(state_dir), name)


def _write_json(path: str, data: Any) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1)
    os.replace(tmp, path)


def _read_json(path: str, default: Any) -> Any:
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return default


def write_host_config(state_dir: StrPath, config: HostConfig) -> None:
    os.makedirs(state_dir, exist_ok=True)
    data = {
        "gpus": [g.to_dict() for g in config.gpus],
        "release_delay_s": config.release_delay_s,
        "driver_version": config.driver_version,
        "startup_s": config.startup_s,
    }
    _write_json(_path(state_dir, HOST_FILE), data)


def read_host_config(state_dir: StrPath) -> HostConfig:
    data = _read_json(_path(state_dir, HOST_FILE), None)
    if data is None:
        raise FileNotFoundError(f"{_path(state_dir, HOST_FILE)}: no simulated host here; call sim_environment() first")
    gpus = tuple(SimGpu(**g) for g in data.get("gpus", []))
    return HostConfig(
        gpus=gpus,
        release_delay_s=float(data.get("release_delay_s", DEFAULT_RELEASE_DELAY_S)),
        driver_version=str(data.get("driver_version", DEFAULT_DRIVER)),
        startup_s=data.get("startup_s"),
    )


def read_faults(state_dir: StrPath) -> dict[str, Any]:
    faults = _read_json(_path(state_dir, FAULTS_FILE), {})
    return faults if isinstance(faults, dict) else {}


def write_faults(state_dir: StrPath, **knobs: Any) -> None:
    """Set fault knobs (see FAULT_KNOBS); a knob set to None/False/[] is removed."""
    unknown = set(knobs) - set(FAULT_KNOBS)
    if unknown:
        raise ValueError(f"unknown fault knob(s) {sorted(unknown)}; known: {', '.join(FAULT_KNOBS)}")
    with StateLock(state_dir):
        faults = read_faults(state_dir)
        for key, value in knobs.items():
            if value in (None, False, []):
                faults.pop(key, None)
            else:
                faults[key] = value
        _write_json(_path(state_dir, FAULTS_FILE), faults)


class StateLock:
    """Exclusive fcntl lock over the mutable parts of the state folder (a context manager)."""

    def __init__(self, state_dir: StrPath) -> None:
        self.path = _path(state_dir, LOCK_FILE)
        self.fd = -1

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _read_records(state_dir: StrPath) -> list[AllocationRecord]:
    data = _read_json(_path(state_dir, ALLOC_FILE), {"records": []})
    return [AllocationRecord(**r) for r in data.get("records", [])]


def _write_records(state_dir: StrPath, records: list[AllocationRecord]) -> None:
    _write_json(_path(state_dir, ALLOC_FILE), {"records": [r.to_dict() for r in records]})


# ---------------------------------------------------------------------------------------------- liveness


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot), or None if the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ")".
    rest = raw[raw.rfind(b")") + 2 :].split()
    state = rest[0]
    if state in (b"Z", b"X", b"x"):
        return None
    return int(rest[19])  # rest[0] is field 3, so field 22 is rest[19]


def owner_alive(record: AllocationRecord) -> bool:
    return process_start_time(record.pid) == record.start_time


# ---------------------------------------------------------------------------------------------- API


def snapshot(state_dir: StrPath, now: float | None = None) -> Snapshot:
    """Read the state as the driver sees it now, recording deaths and releasing what is due."""
    config = read_host_config(state_dir)
    faults = read_faults(state_dir)
    now = time.time() if now is None else now
    delay = config.release_delay_s
    records = _read_records(state_dir)
    if not records:
        return Snapshot(config, [], faults)
    # Fast path without the lock when nothing changes.
    if all(r.dead_since is None and owner_alive(r) for r in records):
        return Snapshot(config, records, faults)
    with StateLock(state_dir):
        records = _read_records(state_dir)
        keep: list[AllocationRecord] = []
        released: list[dict[str, Any]] = []
        changed = False
        for rec in records:
            if rec.dead_since is None:
                if owner_alive(rec):
                    keep.append(rec)
                    continue
                rec.dead_since = now
                changed = True
            if rec.leaked or now < rec.dead_since + delay:
                keep.append(rec)
                continue
            changed = True
            released.append(
                {
                    "pid": rec.pid,
                    "name": rec.name,
                    "gpu": rec.gpu,
                    "mib": rec.mib,
                    "phase": rec.phase,
                    "dead_since": rec.dead_since,
                    "released_at": rec.dead_since + delay,
                    "observed_at": now,
                }
            )
        if changed:
            _write_records(state_dir, keep)
        if released:
            with open(_path(state_dir, RELEASED_FILE), "a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in released)
    return Snapshot(config, keep, faults)


class OutOfMemory(Exception):
    """Not enough free memory on a simulated GPU for an allocation."""

    def __init__(self, gpu: SimGpu, want_mib: int, free_mib: int) -> None:
        super().__init__(f"GPU {gpu.index}: wanted {want_mib} MiB, {free_mib} MiB free")
        self.gpu = gpu
        self.want_mib = want_mib
        self.free_mib = free_mib


def allocate(
    state_dir: StrPath, gpu_index: int, mib: int, name: str, phase: str, pid: int | None = None, leaked: bool = False
) -> AllocationRecord:
    """Hold `mib` on GPU `gpu_index` for process `pid` (default: this one). Raises OutOfMemory."""
    pid = os.getpid() if pid is None else pid
    start = process_start_time(pid)
    if start is None:
        raise ProcessLookupError(pid)
    snap = snapshot(state_dir)  # releases what is due first
    gpus = {g.index: g for g in snap.config.gpus}
    if gpu_index not in gpus:
        raise IndexError(f"no simulated GPU {gpu_index} (the host has {len(gpus)})")
    gpu = gpus[gpu_index]
    with StateLock(state_dir):
        records = _read_records(state_dir)
        used = gpu.idle_mib + sum(r.mib for r in records if r.gpu == gpu_index)
        free = gpu.memory_total_mib - gpu.reserved_mib - used
        if mib > free:
            raise OutOfMemory(gpu, mib, free)
        rec = AllocationRecord(gpu_index, pid, start, name, mib, phase, leaked, None, time.time())
        records.append(rec)
        _write_records(state_dir, records)
    return rec


def free_mib(state_dir: StrPath, gpu_index: int) -> int:
    snap = snapshot(state_dir)
    gpu = next(g for g in snap.config.gpus if g.index == gpu_index)
    return gpu.memory_total_mib - gpu.reserved_mib - snap.used_mib(gpu)


def mark_leaked(state_dir: StrPath, pid: int) -> None:
    """Flag every record of `pid` as leaked (kept after the owner dies)."""
    with StateLock(state_dir):
        records = _read_records(state_dir)
        for rec in records:
            if rec.pid == pid:
                rec.leaked = True
        _write_records(state_dir, records)


def released_log(state_dir: StrPath) -> list[dict[str, Any]]:
    """Every release so far, oldest first (for benchmarks: the driver's actual release times)."""
    try:
        with open(_path(state_dir, RELEASED_FILE)) as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def write_load(path: StrPath, batch: int, tokens_per_seq: int) -> None:
    """The decoding server's load now, for power.draw: sequences in the batch, target tokens per sequence per step
    (1 + draft tokens verified). Written by rename, so a reader never sees half of it."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as fh:
            json.dump({"batch": int(batch), "tokens_per_seq": int(tokens_per_seq)}, fh)
        os.replace(tmp, path)
    except OSError:
        pass


def read_load(state_dir: StrPath, now: float | None = None) -> tuple[int, int] | None:
    """(batch, tokens per sequence) when the server decoded in the last BUSY_FRESH_S, else None. An old-style
    empty busy file (a server of an earlier release of the simulator) reads as one sequence of one token."""
    path = _path(state_dir, BUSY_FILE)
    try:
        if (time.time() if now is None else now) - os.stat(path).st_mtime >= BUSY_FRESH_S:
            return None
        with open(path) as fh:
            data = json.loads(fh.read() or "{}")
    except (OSError, ValueError):
        return None if not os.path.exists(path) else (1, 1)
    if not isinstance(data, dict):
        return 1, 1
    batch, per_seq = data.get("batch", 1), data.get("tokens_per_seq", 1)
    if not isinstance(batch, int) or not isinstance(per_seq, int):
        return 1, 1
    return max(batch, 1), max(per_seq, 1)


def power_draw_w(gpu: SimGpu, loaded: bool, load: tuple[int, int] | None, jitter: float = POWER_JITTER) -> float:
    """What `power.draw` reads for one GPU (the model in the module docstring)."""
    limit = gpu.power_limit_w
    if not loaded:
        watts = IDLE_POWER_FRACTION * limit
    else:
        held = LOADED_POWER_FRACTION * limit
        if load is None:
            watts = held
        else:
            tokens = load[0] * load[1]
            activity = DECODE_FLOOR + (1 - DECODE_FLOOR) * (1 - math.exp(-(tokens - 1) / DECODE_TOKENS_SCALE))
            watts = held + (limit - held) * activity
    if jitter:
        watts *= 1 + random.gauss(0, jitter)
    return max(0.0, min(watts, limit))


def clear_allocations(state_dir: StrPath) -> None:
    with StateLock(state_dir):
        _write_records(state_dir, [])
        try:
            os.unlink(_path(state_dir, RELEASED_FILE))
        except FileNotFoundError:
            pass
