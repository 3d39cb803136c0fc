"""A fake `nvidia-smi` for the simulated host: CSV queries, loop mode and real failure messages.

Run as `python -m app.sim.nvidia_smi ARGS` (the state folder's bin/nvidia-smi wrapper does that) with
TUNEDASH_SIM_STATE pointing at the state folder. Stdlib only: it is spawned often and must start fast.

Supported, matching the real tool (docs/gpus.md):
    --query-gpu=F1,F2 [--format=csv[,noheader][,nounits]] [-i IDS] [-l [SEC] | -lms MS]
    --query-compute-apps=F1,F2 ...   (one row per process and GPU; nothing at all when no process holds memory)
    -L                               (GPU 0: NAME (UUID: GPU-...))
    --query-gpu=compute_cap          (e.g. 8.6; the header has no unit, as on a real H200: tests/data/smi/)
    topo -m | topo --matrix          (the real layout: tab-separated cells, the header row underlined with
                                      ESC[4m ... ESC[0m even into a pipe, X on the diagonal, NV<links> between
                                      two GPUs with NVLinks, else gpu_state's PCIe path; CPU Affinity, NUMA
                                      Affinity, GPU NUMA ID; then the Legend block)
    no arguments                     (a short table, for humans only)
power.draw follows the simulated server's load (gpu_state.power_draw_w: the model and its assumptions are in
gpu_state's docstring); utilization, temperature, clocks and fan are three levels (idle, memory held, decoding).
Errors: unknown field -> `Field "x" is not a valid field to query.` + empty line, rc 2; no GPU or bad -i ->
`No devices were found`, rc 6; the fault knobs of faults.json (gpu_state.FAULT_KNOBS) print the real texts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from app.sim.gpu_state import AllocationRecord, SimGpu, Snapshot, power_draw_w, read_load, snapshot

RC_BAD_ARG = 2
RC_NOT_FOUND = 6
RC_DRIVER_NOT_LOADED = 9
RC_GPU_LOST = 15
RC_MISMATCH = 18
RC_OTHER = 255

INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."


class Context:
    """What one output line needs: the snapshot, the GPU, whether the GPU is busy and the server's load."""

    def __init__(self, snap: Snapshot, gpu: SimGpu, load: tuple[int, int] | None, now: float) -> None:
        self.snap = snap
        self.gpu = gpu
        self.busy = load is not None
        self.load = load
        self.now = now
        self.used = snap.used_mib(gpu)
        self.loaded = any(r.gpu == gpu.index for r in snap.records)


Getter = Callable[[Context], str]


def _ts(now: float) -> str:
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"


def _level(c: Context, idle: str, loaded: str, busy: str) -> str:
    return busy if c.busy else loaded if c.loaded else idle


# canonical name -> (header unit or "", value unit or "", getter)
GPU_FIELDS: dict[str, tuple[str, Getter]] = {
    "timestamp": ("", lambda c: _ts(c.now)),
    "driver_version": ("", lambda c: c.snap.config.driver_version),
    "count": ("", lambda c: str(len(c.snap.config.gpus))),
    "index": ("", lambda c: str(c.gpu.index)),
    "uuid": ("", lambda c: c.gpu.uuid),
    "name": ("", lambda c: c.gpu.name),
    "serial": ("", lambda c: f"13{c.gpu.index:011d}"),
    "compute_cap": ("", lambda c: c.gpu.compute_cap),
    "pci.bus_id": ("", lambda c: c.gpu.pci_bus_id),
    "persistence_mode": ("", lambda c: "Enabled"),
    "pstate": ("", lambda c: _level(c, "P8", "P2", "P2")),
    "compute_mode": ("", lambda c: "Default"),
    "mig.mode.current": ("", lambda c: "[N/A]"),
    "mig.mode.pending": ("", lambda c: "[N/A]"),
    "fan.speed": ("%", lambda c: _level(c, "30", "30", "52")),
    "memory.total": ("MiB", lambda c: str(c.gpu.memory_total_mib)),
    "memory.reserved": ("MiB", lambda c: str(c.gpu.reserved_mib)),
    "memory.used": ("MiB", lambda c: str(c.used)),
    "memory.free": ("MiB", lambda c: str(max(0, c.gpu.memory_total_mib - c.gpu.reserved_mib - c.used))),
    "utilization.gpu": ("%", lambda c: _level(c, "0", "0", "96")),
    "utilization.memory": ("%", lambda c: _level(c, "0", "0", "71")),
    "temperature.gpu": ("", lambda c: _level(c, "31", "44", "71")),
    "temperature.memory": ("", lambda c: "N/A"),
    "power.draw": ("W", lambda c: "[N/A]" if c.gpu.index in (c.snap.faults.get("power_na") or ())
                   else f"{power_draw_w(c.gpu, c.loaded, c.load):.2f}"),
    "power.limit": ("W", lambda c: f"{c.gpu.power_limit_w:.2f}"),
    "clocks.current.sm": ("MHz", lambda c: _level(c, "210", "1410", "1800")),
    "clocks.current.memory": ("MHz", lambda c: _level(c, "405", "8000", "8000")),
}
GPU_ALIASES = {
    "gpu_uuid": "uuid",
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
    "gpu_serial": "serial",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "gpu.power.requested_limit": "power.limit",
}

APP_FIELDS = ("timestamp", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "pid", "process_name", "used_gpu_memory")
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


class Usage(Exception):
    """Bad command line: message and exit code."""

    def __init__(self, message: str, code: int = RC_BAD_ARG) -> None:
        super().__init__(message)
        self.code = code


class Options:
    """The parsed command line."""

    def __init__(self) -> None:
        self.query_gpu: list[str] | None = None
        self.query_apps: list[str] | None = None
        self.header = True
        self.units = True
        self.ids: list[str] | None = None
        self.loop_s: float | None = None
        self.list_gpus = False


def parse_args(argv: list[str]) -> Options:
    opts = Options()
    i = 0

    def value(flag: str) -> str:
        nonlocal i
        if i + 1 >= len(argv):
            raise Usage(INVALID_ARGS)
        i += 1
        return argv[i]

    while i < len(argv):
        arg = argv[i]
        key, eq, inline = arg.partition("=")
        if key in ("--query-gpu", "--query-compute-apps", "--format", "--id", "-i", "--loop", "--loop-ms", "-lms"):
            text = inline if eq else value(key)
            if key == "--query-gpu":
                opts.query_gpu = [f.strip() for f in text.split(",") if f.strip()]
            elif key == "--query-compute-apps":
                opts.query_apps = [f.strip() for f in text.split(",") if f.strip()]
            elif key == "--format":
                parts = {p.strip() for p in text.split(",")}
                if not parts <= {"csv", "noheader", "nounits"}:
                    raise Usage(INVALID_ARGS)
                opts.header = "noheader" not in parts
                opts.units = "nounits" not in parts
            elif key in ("--id", "-i"):
                opts.ids = [x.strip() for x in text.split(",") if x.strip()]
            else:
                try:
                    n = float(text)
                except ValueError as exc:
                    raise Usage(INVALID_ARGS) from exc
                opts.loop_s = n / 1000 if key in ("--loop-ms", "-lms") else n
        elif arg == "-l":
            if i + 1 < len(argv) and argv[i + 1].replace(".", "", 1).isdigit():
                opts.loop_s = float(value(arg))
            else:
                opts.loop_s = 5.0
        elif arg in ("-L", "--list-gpus"):
            opts.list_gpus = True
        else:
            raise Usage(INVALID_ARGS)
        i += 1
    if opts.loop_s is not None and opts.loop_s <= 0:
        raise Usage(INVALID_ARGS)
    return opts


def _check_fields(fields: list[str], known: tuple[str, ...], aliases: dict[str, str]) -> list[str]:
    out = []
    for f in fields:
        canon = aliases.get(f, f)
        if canon not in known:
            raise Usage(f'Field "{f}" is not a valid field to query.\n')
        out.append(canon)
    return out


def _select(gpus: tuple[SimGpu, ...], ids: list[str] | None) -> list[SimGpu]:
    if ids is None:
        return list(gpus)
    chosen: list[SimGpu] = []
    for ident in ids:
        hits = [g for g in gpus if ident in (str(g.index), g.uuid) or ident.lower() == g.pci_bus_id.lower()]
        if not hits:
            return []
        chosen += [g for g in hits if g not in chosen]
    return sorted(chosen, key=lambda g: g.index)


def _init_failure(snap: Snapshot) -> Usage | None:
    faults = snap.faults
    version = snap.config.driver_version
    if faults.get("driver_not_loaded"):
        return Usage(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n",
            RC_DRIVER_NOT_LOADED,
        )
    if faults.get("driver_mismatch"):
        lib = ".".join(version.split(".")[:2])
        text = f"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {lib}"
        return Usage(text, RC_MISMATCH)
    if faults.get("nvml_unknown_error"):
        return Usage("Failed to initialize NVML: Unknown Error", RC_OTHER)
    if faults.get("no_devices") or not snap.config.gpus:
        return Usage("No devices were found", RC_NOT_FOUND)
    return None


def _gpu_lines(
    opts: Options, fields: list[str], snap: Snapshot, gpus: list[SimGpu], looping: bool
) -> tuple[list[str], int]:
    lost = set(snap.faults.get("lost_gpus") or [])
    now = time.time()
    load = _load(snap, now)
    lines: list[str] = []
    rc = 0
    for gpu in gpus:
        if gpu.index in lost:
            if looping:
                lines.append(", ".join("[GPU is lost]" for _ in fields))
            else:
                lines.append(
                    f"Unable to determine the device handle for GPU {gpu.pci_bus_id}: GPU is lost. "
                    "Reboot the system to recover this GPU"
                )
                rc = RC_GPU_LOST
            continue
        ctx = Context(snap, gpu, load, now)
        values = []
        for f in fields:
            unit, get = GPU_FIELDS[f]
            v = get(ctx)
            if opts.units and unit and not v.startswith("[") and v != "N/A":
                v = f"{v} {unit}"
            values.append(v)
        lines.append(", ".join(values))
    return lines, rc


def _load(snap: Snapshot, now: float) -> tuple[int, int] | None:
    """The decoding server's (batch, tokens per sequence) when it decoded lately and memory is held, else None."""
    state = os.environ.get("TUNEDASH_SIM_STATE")
    if not state or not snap.records:
        return None
    return read_load(state, now)


def _app_lines(opts: Options, fields: list[str], snap: Snapshot, gpus: list[SimGpu]) -> list[str]:
    lost = set(snap.faults.get("lost_gpus") or [])
    by_index = {g.index: g for g in gpus if g.index not in lost}
    # One row per (pid, gpu), in GPU order then first-allocation order.
    rows: dict[tuple[int, int], list[AllocationRecord]] = {}
    for rec in snap.records:
        if rec.gpu in by_index:
            rows.setdefault((rec.gpu, rec.pid), []).append(rec)
    now = time.time()
    lines = []
    for (gpu_index, pid), recs in sorted(rows.items(), key=lambda kv: kv[0][0]):
        gpu = by_index[gpu_index]
        mib = sum(r.mib for r in recs)
        cells = {
            "timestamp": _ts(now),
            "gpu_name": gpu.name,
            "gpu_bus_id": gpu.pci_bus_id,
            "gpu_serial": f"13{gpu.index:011d}",
            "gpu_uuid": gpu.uuid,
            "pid": str(pid),
            "process_name": recs[0].name,
            "used_gpu_memory": f"{mib} MiB" if opts.units else str(mib),
        }
        lines.append(", ".join(cells[f] for f in fields))
    return lines


def _header(fields: list[str], units: dict[str, str]) -> str:
    return ", ".join(f"{f} [{units[f]}]" if units.get(f) else f for f in fields)


def _table(snap: Snapshot) -> str:
    out = [time.strftime("%a %b %d %H:%M:%S %Y"), f"NVIDIA-SMI {snap.config.driver_version} (simulated)"]
    for g in snap.config.gpus:
        out.append(f"  {g.index}  {g.name:<24} {snap.used_mib(g):>6}MiB / {g.memory_total_mib}MiB")
    out.append("Processes:")
    if not snap.records:
        out.append("  No running processes found")
    for r in snap.records:
        out.append(f"  {r.gpu}  {r.pid:>8}  C  {r.name:<32} {r.mib}MiB")
    return "\n".join(out)


# What the real tool prints (driver 580.159.04 on an H200; tests/data/smi/topo_h200_1gpu.txt).
TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""
# The real text for `topo -m -i N` (reported for driver 5xx); its exit code was not captured: rc 2 here.
TOPO_I_WITHOUT_N_OR_P = "The -i command line argument must be used in conjunction with -n or -p."
PCIE_PATH = "PHB"  # the path between two simulated GPUs without NVLink: through the CPU's PCIe host bridge


def link_between(a: SimGpu, b: SimGpu) -> str:
    """The topo -m cell for two distinct GPUs: NV<links> when both have NVLinks, else the PCIe path."""
    links = min(a.nvlinks, b.nvlinks)
    return f"NV{links}" if links > 0 else PCIE_PATH


def topo_matrix(snap: Snapshot) -> str:
    """`nvidia-smi topo -m` of the simulated host, cell for cell as the real tool prints it."""
    gpus = snap.config.gpus
    cpus = os.cpu_count() or 1
    affinity = f"0-{cpus - 1}" if cpus > 1 else "0"
    header = "\t".join([f"GPU{g.index}" for g in gpus] + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    lines = [f"\t\x1b[4m{header}\x1b[0m"]
    for row in gpus:
        cells = [" X " if col is row else link_between(row, col) for col in gpus]
        lines.append("\t".join([f"GPU{row.index}", *cells, affinity, "0", "", "N/A"]))
    return "\n".join(lines) + "\n" + TOPO_LEGEND


def run_topo(argv: list[str], state_dir: str, write: Callable[[str], None]) -> int:
    """`nvidia-smi topo ARGS`: only the matrix (-m, --matrix)."""
    try:
        if "-i" in argv or "--id" in argv:
            raise Usage(TOPO_I_WITHOUT_N_OR_P)
        if argv not in (["-m"], ["--matrix"]):
            raise Usage(INVALID_ARGS)
        snap = snapshot(state_dir)
        failure = _init_failure(snap)
        if failure is not None:
            raise failure
        lost = sorted(set(snap.faults.get("lost_gpus") or []))
        gone = [g for g in snap.config.gpus if g.index in lost]
        if gone:
            raise Usage(f"Unable to determine the device handle for GPU {gone[0].pci_bus_id}: GPU is lost. "
                        "Reboot the system to recover this GPU", RC_GPU_LOST)
        write(topo_matrix(snap))
        return 0
    except Usage as exc:
        write(str(exc) + "\n")
        return exc.code


def run(argv: list[str], state_dir: str, write: Callable[[str], None]) -> int:
    if argv[:1] == ["topo"]:
        return run_topo(argv[1:], state_dir, write)
    try:
        opts = parse_args(argv)
        if opts.query_gpu is not None and opts.query_apps is not None:
            raise Usage(INVALID_ARGS)
        gpu_fields = _check_fields(opts.query_gpu, tuple(GPU_FIELDS), GPU_ALIASES) if opts.query_gpu is not None else []
        app_fields = _check_fields(opts.query_apps, APP_FIELDS, APP_ALIASES) if opts.query_apps is not None else []
        first = True
        while True:
            snap = snapshot(state_dir)
            failure = _init_failure(snap)
            if failure is not None:
                raise failure
            gpus = _select(snap.config.gpus, opts.ids)
            if not gpus:
                raise Usage("No devices were found", RC_NOT_FOUND)
            rc = 0
            lines: list[str] = []
            if opts.list_gpus:
                lines = [f"GPU {g.index}: {g.name} (UUID: {g.uuid})" for g in gpus]
            elif opts.query_gpu is not None:
                if first and opts.header:
                    units = {f: GPU_FIELDS[f][0] for f in gpu_fields}
                    lines.append(_header(gpu_fields, units))
                body, rc = _gpu_lines(opts, gpu_fields, snap, gpus, opts.loop_s is not None)
                lines += body
            elif opts.query_apps is not None:
                if first and opts.header:
                    lines.append(_header(app_fields, {"used_gpu_memory": "MiB"}))
                lines += _app_lines(opts, app_fields, snap, gpus)
            else:
                lines = [_table(snap)]
            if lines:
                write("\n".join(lines) + "\n")
            first = False
            if opts.loop_s is None:
                return rc
            time.sleep(opts.loop_s)
    except Usage as exc:
        write(str(exc) + "\n")
        return exc.code


def main(argv: list[str] | None = None) -> int:
    state = os.environ.get("TUNEDASH_SIM_STATE")
    if not state:
        sys.stdout.write(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n"
        )
        return RC_DRIVER_NOT_LOADED

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    try:
        return run(sys.argv[1:] if argv is None else argv, state, write)
    except (KeyboardInterrupt, BrokenPipeError):
        try:
            sys.stdout.close()
        except BrokenPipeError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main())
