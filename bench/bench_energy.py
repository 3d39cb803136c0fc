"""Energy per token: speculative steps 1 vs 3 on the demo (simulated power), and the NVML meter on a real GPU.

demo   The demo profile (a private copy: its own port and simulated host), launches interleaved A B B A (A: steps
       1, B: steps 3), --trials benches per launch, each through app.core.measure.bench.run_bench with the meter
       tunedash gives the profile (energy_meter_for: the nvidia-smi power.draw integral on the simulated host).
       Prints per arm the median J/token, tokens/J, mean W per GPU and tok/s, and B/A of each.

         .venv/bin/python bench/bench_energy.py demo [--launches 2] [--trials 3] [--requests 8]

gpu    On a machine with an NVIDIA GPU, torch and nvidia-ml-py (the device: scripts below). A torch process runs a
       steady bf16 matmul loop (the stand-in for a server) and logs the matmuls it finished; a side process reads
       NVML's total energy counter every --side-period-ms on its own. Over --windows windows of --window-s
       seconds, tunedash's NvmlEnergyMeter (counter read at the two edges) is compared with the side reader's
       counter over the same window (interpolated at the meter's edges; target: within 2 %), and the
       SmiEnergyMeter (nvidia-smi power.draw integral) runs over the same window for comparison. J per unit of
       work = J per TFLOP of matmuls finished in the window. Also: the cost of one counter read against one
       memory query. Prints medians; --out DIR keeps the raw samples as JSON.

         python3 bench/bench_energy.py gpu [--windows 8] [--window-s 4] [--out DIR]

side-reader / matmul-worker: the two helper processes of `gpu` (started by it).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core.telemetry.energy import NvmlEnergyMeter, SmiEnergyMeter  # noqa: E402


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---- demo ------------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def demo(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    from app.connect import host_for
    from app.core.measure.bench import BenchSpec, run_bench
    from app.core.measure.experiment import parse_arm
    from app.core.profiles.loading import load_profile
    from app.core.server.lifecycle import ServerLifecycle
    from app.core.telemetry.energy import energy_meter_for
    from app.core.telemetry.smi import telemetry_for
    from app.sim.host_env import reset_state

    tmp = Path(tempfile.mkdtemp(prefix="tunedash-bench-energy-"))
    state = reset_state(tmp / "sim")
    text = (REPO / "profiles" / "demo.toml").read_text()
    text = text.replace("port = 30000", f'port = {args.port or free_port()}\nsim_state = "{state}"\n'
                        'env = { TUNEDASH_SIM_STARTUP_S = "0.5" }', 1)
    path = tmp / "demo.toml"
    path.write_text(text)
    profile = load_profile(path)
    host = host_for(profile)
    life = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus), grace_s=3)
    arms = {"A": parse_arm(profile, "speculative-num-steps=1", "A"),
            "B": parse_arm(profile, "speculative-num-steps=3", "B")}
    spec = BenchSpec.from_settings(profile.bench, requests=args.requests, warmup=0)
    order = "".join("AB" if i % 2 == 0 else "BA" for i in range(args.launches))
    rows: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    print(f"demo: {profile.name} on {host.name}; launches {' '.join(order)}, {args.trials} trials each of "
          f"{spec.requests} requests at concurrency {spec.concurrency}, {spec.max_tokens} tokens", flush=True)
    try:
        for launch, label in enumerate(order):
            arm = arms[label]
            state_after = await life.relaunch(arm.profile, ready_timeout_s=60)
            if state_after.value != "READY":
                raise SystemExit(f"arm {label}: server not ready ({state_after.value})")
            url = await host.http_base(arm.profile.port)
            await run_bench(url, arm.profile.model, BenchSpec(**{**spec.__dict__, "requests": 2}))  # warm-up
            for trial in range(args.trials):
                result = await run_bench(url, arm.profile.model, spec, energy=energy_meter_for(host, arm.profile))
                s = result.summary
                energy = s.energy
                row = {"launch": launch, "trial": trial, "tok_s": s.output_tok_s, "energy": energy,
                       "note": s.energy_note}
                rows[label].append(row)
                shown = (f"{energy['j_per_token']:.3f} J/token, {energy['tokens_per_j']:.3f} tokens/J, mean "
                         f"{', '.join(f'{w:.1f}' for w in energy['mean_w_per_gpu'])} W per GPU "
                         f"({energy['method']})") if energy else f"energy unavailable ({s.energy_note})"
                print(f"  {label} launch {launch + 1} trial {trial + 1}: {s.output_tok_s or 0:.1f} tok/s, {shown}",
                      flush=True)
    finally:
        await life.kill(confirm_free=False)
        await life.close()
        for record in (state / "host" / "jobs").glob("*.json"):
            try:
                os.killpg(json.loads(record.read_text())["pgid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError, KeyError, ValueError, TypeError):
                pass

    def figures(label: str) -> dict[str, float]:
        got = [r for r in rows[label] if r["energy"]]
        return {"j_per_token": median([r["energy"]["j_per_token"] for r in got]),
                "tokens_per_j": median([r["energy"]["tokens_per_j"] for r in got]),
                "mean_w": median([statistics.fmean(r["energy"]["mean_w_per_gpu"]) for r in got]),
                "tok_s": median([r["tok_s"] for r in rows[label] if r["tok_s"]]),
                "measured": len(got), "trials": len(rows[label])}

    a, b = figures("A"), figures("B")
    print("\nmedians over trials           A (steps 1)   B (steps 3)   B/A")
    for key, name in (("tok_s", "output tok/s"), ("mean_w", "mean W per GPU"), ("j_per_token", "J/token"),
                      ("tokens_per_j", "tokens/J")):
        print(f"  {name:<26} {a[key]:>11.3f}   {b[key]:>11.3f}   {b[key] / a[key]:.3f}")
    print(f"  energy measured in {a['measured']}/{a['trials']} (A) and {b['measured']}/{b['trials']} (B) trials")
    print(f"B uses {100 * (1 - b['j_per_token'] / a['j_per_token']):.1f}% less energy per token than A "
          f"(J/token B/A {b['j_per_token'] / a['j_per_token']:.3f}; tok/s B/A {b['tok_s'] / a['tok_s']:.3f})")
    return rows


# ---- gpu: helper processes ---------------------------------------------------------------------------------------

def side_reader(args: argparse.Namespace) -> None:
    """Reads GPU --gpu's total energy counter every --period-ms until SIGTERM: lines "monotonic mJ"."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    with open(args.file, "w") as out:
        while not stop:
            before = time.monotonic()
            mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            after = time.monotonic()
            out.write(f"{(before + after) / 2:.6f} {mj}\n")
            out.flush()
            time.sleep(max(0.0, args.period_ms / 1000 - (time.monotonic() - before)))
    pynvml.nvmlShutdown()


def matmul_worker(args: argparse.Namespace) -> None:
    """A steady bf16 matmul loop on GPU --gpu for --seconds: "ready", then lines "monotonic matmuls_done"."""
    import torch  # type: ignore[import-not-found, unused-ignore]  # the GPU machine's torch

    torch.cuda.set_device(args.gpu)
    n = args.size
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(30):
        torch.matmul(x, y, out=out)
    torch.cuda.synchronize()
    print("ready", flush=True)
    done = 0
    deadline = time.monotonic() + args.seconds
    print(f"{time.monotonic():.6f} 0", flush=True)
    while time.monotonic() < deadline:
        for _ in range(10):
            torch.matmul(x, y, out=out)
        torch.cuda.synchronize()
        done += 10
        print(f"{time.monotonic():.6f} {done}", flush=True)


def interpolate(series: list[tuple[float, float]], t: float) -> float | None:
    """The value of a (time, cumulative value) series at t, linear between points; None outside it."""
    times = [p[0] for p in series]
    i = bisect.bisect_left(times, t)
    if i == 0 or i >= len(series):
        return None
    (t0, v0), (t1, v1) = series[i - 1], series[i]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v0


def read_series(path: Path) -> list[tuple[float, float]]:
    points = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] != "ready":
            try:
                points.append((float(parts[0]), float(parts[1])))
            except ValueError:
                continue
    return points


def nvml_read_cost(reads: int) -> dict[str, float]:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    costs: dict[str, float] = {}
    for name, call in (("energy_counter", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
                       ("memory_info", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle)),
                       ("power_usage", lambda: pynvml.nvmlDeviceGetPowerUsage(handle))):
        times = []
        for _ in range(reads):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        costs[name] = median(times) * 1e6
    pynvml.nvmlShutdown()
    return costs


def gpu(args: argparse.Namespace) -> None:
    import pynvml
    import torch  # type: ignore[import-not-found, unused-ignore]  # the GPU machine's torch

    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tunedash-energy-gpu-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    name = pynvml.nvmlDeviceGetName(handle)
    driver = pynvml.nvmlSystemGetDriverVersion()
    limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000
    pynvml.nvmlShutdown()
    print(f"gpu: {name}, driver {driver}, power limit {limit_w:.0f} W; torch {torch.__version__}; "
          f"matmul {args.size}^3 bf16; {args.windows} windows of {args.window_s} s", flush=True)
    costs = nvml_read_cost(args.cost_reads)
    print(f"NVML read cost (median of {args.cost_reads}): energy counter {costs['energy_counter']:.0f} us, "
          f"memory info {costs['memory_info']:.0f} us, power usage {costs['power_usage']:.0f} us", flush=True)

    side_file, work_file = out_dir / "side_reader.txt", out_dir / "matmul_worker.txt"
    script = str(Path(__file__).resolve())
    side = subprocess.Popen([sys.executable, script, "side-reader", "--gpu", str(args.gpu), "--period-ms",
                             str(args.side_period_ms), "--file", str(side_file)])
    total_s = args.settle_s + args.windows * (args.window_s + 1.5) + 5
    with open(work_file, "w") as work_out:
        worker = subprocess.Popen([sys.executable, script, "matmul-worker", "--gpu", str(args.gpu), "--size",
                                   str(args.size), "--seconds", str(total_s)], stdout=work_out)
    try:
        deadline = time.monotonic() + 120
        while "ready" not in work_file.read_text():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the matmul worker did not start (exit {worker.returncode})")
            time.sleep(0.1)
        time.sleep(args.settle_s)  # clocks and power settle under the steady load
        windows = asyncio.run(measure_windows(args, out_dir))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        time.sleep(0.3)
        side.terminate()
        side.wait(timeout=30)
    report_gpu(args, out_dir, windows, read_series(side_file), read_series(work_file),
               {"gpu": name, "driver": driver, "power_limit_w": limit_w, "read_cost_us": costs})


async def measure_windows(args: argparse.Namespace, out_dir: Path) -> list[dict[str, Any]]:
    """tunedash's two meters over the same windows: smi started first (it waits for its first sample), NVML
    inside it."""
    from app.core.hosts.local import LocalHost

    host = LocalHost("local", state_dir=str(out_dir / "state"))
    windows: list[dict[str, Any]] = []
    for w in range(args.windows):
        smi = SmiEnergyMeter(host, (args.gpu,), period_ms=100)
        await smi.start()
        nvml = NvmlEnergyMeter((args.gpu,))
        await nvml.start()
        await asyncio.sleep(args.window_s)
        nvml_reading = await nvml.stop()
        smi_reading = await smi.stop()
        windows.append({"window": w, "nvml": nvml_reading, "smi": smi_reading})
        print(f"  window {w + 1}: NVML meter {nvml_reading.joules or float('nan'):.1f} J over "
              f"{nvml_reading.window_s:.3f} s; smi {smi_reading.joules or float('nan'):.1f} J over "
              f"{smi_reading.window_s:.3f} s ({smi_reading.samples} samples) {smi_reading.reason}", flush=True)
        await asyncio.sleep(0.5)
    return windows


def report_gpu(args: argparse.Namespace, out_dir: Path, windows: list[dict[str, Any]],
               side: list[tuple[float, float]], work: list[tuple[float, float]], facts: dict[str, Any]) -> None:
    counter = [(t, mj / 1000) for t, mj in side]  # joules
    tflop_per_matmul = 2 * args.size**3 / 1e12
    results = []
    for entry in windows:
        nv, sm = entry["nvml"], entry["smi"]
        row: dict[str, Any] = {"window": entry["window"] + 1, "nvml_j": nv.joules, "nvml_s": nv.window_s,
                               "smi_j": sm.joules, "smi_s": sm.window_s, "smi_samples": sm.samples,
                               "nvml_reason": nv.reason, "smi_reason": sm.reason}
        s0, s1 = interpolate(counter, nv.started_at), interpolate(counter, nv.ended_at)
        w0, w1 = interpolate(work, nv.started_at), interpolate(work, nv.ended_at)
        m0, m1 = interpolate(work, sm.started_at), interpolate(work, sm.ended_at)
        row["side_j"] = None if s0 is None or s1 is None else s1 - s0
        row["tflop"] = None if w0 is None or w1 is None else (w1 - w0) * tflop_per_matmul
        row["smi_tflop"] = None if m0 is None or m1 is None else (m1 - m0) * tflop_per_matmul
        if nv.joules and row["side_j"]:
            row["nvml_vs_side_pct"] = 100 * (nv.joules / row["side_j"] - 1)
        if nv.joules and row["tflop"]:
            row["nvml_j_per_tflop"] = nv.joules / row["tflop"]
            row["side_j_per_tflop"] = row["side_j"] / row["tflop"] if row["side_j"] else None
            row["mean_w"] = nv.joules / nv.window_s
            row["tflop_s"] = row["tflop"] / nv.window_s
        if sm.joules and row["smi_tflop"]:
            row["smi_j_per_tflop"] = sm.joules / row["smi_tflop"]
            row["smi_mean_w"] = sm.joules / sm.window_s
        results.append(row)

    def col(key: str) -> list[float]:
        return [r[key] for r in results if r.get(key) is not None]

    def cell(row: dict[str, Any], key: str, fmt: str) -> str:
        v = row.get(key)
        return format(v, fmt) if isinstance(v, float | int) else "n/a"

    agreement = col("nvml_vs_side_pct")
    print("\nwindow  NVML J  side J  diff %   mean W  TFLOP/s  J/TFLOP nvml  side   smi    smi W")
    for r in results:
        print(f"  {r['window']:>4}  {cell(r, 'nvml_j', '6.1f')}  {cell(r, 'side_j', '6.1f')}  "
              f"{cell(r, 'nvml_vs_side_pct', '+6.3f')}  {cell(r, 'mean_w', '6.1f')}  {cell(r, 'tflop_s', '7.1f')}  "
              f"{cell(r, 'nvml_j_per_tflop', '12.4f')}  {cell(r, 'side_j_per_tflop', '.4f')}  "
              f"{cell(r, 'smi_j_per_tflop', '.4f')}  {cell(r, 'smi_mean_w', '.1f')}")
    nv_jpt, smi_jpt = median(col("nvml_j_per_tflop")), median(col("smi_j_per_tflop"))
    worst = max((abs(x) for x in agreement), default=float("nan"))
    print(f"\nmedians over {len(results)} windows of {args.window_s} s:")
    print(f"  NVML meter vs side reader: {median(agreement):+.3f}% (max |diff| {worst:.3f}%; target within 2%: "
          f"{'met' if agreement and worst <= 2 else 'NOT met'})")
    print(f"  mean power {median(col('mean_w')):.1f} W (NVML) vs {median(col('smi_mean_w')):.1f} W (smi "
          f"power.draw); {median(col('tflop_s')):.0f} TFLOP/s")
    print(f"  J per TFLOP: NVML meter {nv_jpt:.4f}, side reader {median(col('side_j_per_tflop')):.4f}, "
          f"smi integral {smi_jpt:.4f} (smi/NVML {smi_jpt / nv_jpt:.4f})")
    # The side reader over the whole span of the windows, as J per unit of work: the counter steps every ~100 ms,
    # so interpolating it at a window's edges (above) is off by up to a step exactly where a meter that places its
    # edges on steps puts them; over the span those edge errors are a small share.
    span: dict[str, float] = {}
    if results and counter and work:
        t0 = min(e["nvml"].started_at for e in windows)
        t1 = max(e["nvml"].ended_at for e in windows)
        e0, e1 = interpolate(counter, t0), interpolate(counter, t1)
        w0, w1 = interpolate(work, t0), interpolate(work, t1)
        if e0 is not None and e1 is not None and w0 is not None and w1 is not None and w1 > w0:
            span = {"seconds": t1 - t0, "j_per_tflop": (e1 - e0) / ((w1 - w0) * tflop_per_matmul)}
    if span:
        diffs = [100 * (x / span["j_per_tflop"] - 1) for x in col("nvml_j_per_tflop")]
        worst_span = max(abs(x) for x in diffs)
        print(f"  J per TFLOP, each window's meter against the side reader over the whole {span['seconds']:.1f} s "
              f"({span['j_per_tflop']:.4f}): median {median(diffs):+.3f}%, max |diff| {worst_span:.3f}% (target "
              f"within 2%: {'met' if worst_span <= 2 else 'NOT met'})")
    print(f"  side reader: {len(counter)} counter reads, every {args.side_period_ms} ms")
    (out_dir / "energy_gpu.json").write_text(json.dumps({**facts, "windows": results, "span": span}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("demo")
    p.add_argument("--launches", type=int, default=2)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--out", default="")
    p = sub.add_parser("gpu")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--window-s", type=float, default=4.0)
    p.add_argument("--settle-s", type=float, default=5.0)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--side-period-ms", type=int, default=20)
    p.add_argument("--cost-reads", type=int, default=300)
    p.add_argument("--out", default="")
    p = sub.add_parser("side-reader")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--period-ms", type=int, default=20)
    p.add_argument("--file", required=True)
    p = sub.add_parser("matmul-worker")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    if args.mode == "demo":
        rows = asyncio.run(demo(args))
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "energy_demo.json").write_text(json.dumps(rows, indent=1))
    elif args.mode == "gpu":
        gpu(args)
    elif args.mode == "side-reader":
        side_reader(args)
    else:
        matmul_worker(args)


if __name__ == "__main__":
    main()
