"""The dashboard's CPU and key latency, this tree against another (an earlier commit), on the same simulator.

Issue 25's bar is "no worse than before": the same measurement (bench/bench_dashboard.py's `measure_cpu`, the
headless app against the simulated host with 8 GPUs at 4 Hz, the probe and the chart; and `measure_tmux`, `s` ->
the screen in a real tmux) taken from both trees in one run. Each tree measures with its own bench_dashboard.py and
its own app, but the other tree gets this tree's `app/sim` copied in, so the simulated server, whose speed decides
how many probe completions the dashboard handles, is the same on both sides and only the dashboard differs.

Runs go in pairs, one of each tree at the same moment (so load on the machine hits both alike), `--parallel` pairs
at once, `--runs` pairs in all, each its own process, state folder and port. Printed: each tree's CPU-s/min
(median and range), after/before, the share of pairs where after used less, and with `--keys` one tmux key run
per tree, one after the other (median and p95 of `s` -> the pending value on the terminal, and that process's CPU).

    .venv/bin/python bench/bench_dashboard_trees.py --before d97014f --runs 8 --parallel 4 --seconds 30 --keys

`--before` is a commit of this repository (exported with `git archive`) or a folder holding such a tree (for a
machine with no .git: export it there first, e.g. `git archive d97014f | tar -x -C .before`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one(tree: Path, seconds: float, keys: int) -> None:
    """In a child process: one measurement with `tree`'s own bench_dashboard and app; JSON on stdout."""
    sys.path[:0] = [str(tree), str(tree / "bench")]
    os.chdir(tree)
    import bench_dashboard as bd  # the tree's own

    async def run() -> dict[str, float]:
        with tempfile.TemporaryDirectory(prefix="tunedash-trees-") as tmp:
            folder = Path(tmp)
            profile = bd.make_profile(folder)
            try:
                from app.core.server.lifecycle import ServerLifecycle
                from app.core.telemetry.smi import telemetry_for

                host = bd.host_for(profile)
                lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))
                await lifecycle.launch()
                await lifecycle.wait_ready(120)
                await lifecycle.close()
                if keys:
                    figures, tmux_cpu = bd.measure_tmux(profile, keys, seconds, folder)
                    return {"key_median_ms": statistics.median(figures.output_ms),
                            "key_p95_ms": bd.p95(figures.output_ms), "tmux_cpu": tmux_cpu}
                full, kids, replots = await bd.measure_cpu(profile, seconds, sampling=True)
                return {"cpu": full, "children": kids, "replots": float(replots)}
            finally:
                bd.kill_launched(folder / "sim")

    print(json.dumps(asyncio.run(run())))


def export(rev_or_dir: str, into: Path) -> Path:
    """The `before` tree as a folder, with this tree's app/sim in it (the same simulator on both sides)."""
    given = Path(rev_or_dir)
    if given.is_dir():
        tree = into / "before"
        shutil.copytree(given, tree, ignore=shutil.ignore_patterns(".venv", "__pycache__", ".git"))
    else:
        tree = into / "before"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev_or_dir], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    shutil.rmtree(tree / "app" / "sim")
    shutil.copytree(REPO / "app" / "sim", tree / "app" / "sim", ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def start(tree: Path, seconds: float, keys: int = 0) -> subprocess.Popen[str]:
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "TEXTUAL_ANIMATIONS": "none"}
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--one", str(tree), "--seconds",
                             str(seconds), "--keys-presses", str(keys)], stdout=subprocess.PIPE, text=True,
                            env=env, cwd=tree)


def result(proc: subprocess.Popen[str], what: str) -> dict[str, float]:
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0 or not out.strip():
        raise SystemExit(f"{what}: the measurement failed (exit {proc.returncode})")
    data: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return data


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--before", default="d97014f", help="a commit, or a folder holding the earlier tree")
    ap.add_argument("--runs", type=int, default=8, help="pairs of headless runs (one of each tree)")
    ap.add_argument("--parallel", type=int, default=4, help="pairs at once")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--keys", action="store_true", help="then one tmux key run per tree (needs tmux)")
    ap.add_argument("--presses", type=int, default=50)
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--keys-presses", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        one(args.one, args.seconds, args.keys_presses)
        return
    with tempfile.TemporaryDirectory(prefix="tunedash-before-") as tmp:
        before = export(args.before, Path(tmp))
        trees = {"before": before, "after": REPO}
        cpu: dict[str, list[float]] = {"before": [], "after": []}
        load0 = os.getloadavg()[0]
        started = time.monotonic()
        done = 0
        while done < args.runs:
            batch = min(args.parallel, args.runs - done)
            procs = [(name, start(tree, args.seconds)) for _ in range(batch) for name, tree in trees.items()]
            for name, proc in procs:
                cpu[name].append(result(proc, name)["cpu"])
            done += batch
        load1 = os.getloadavg()[0]
        b, a = cpu["before"], cpu["after"]
        print(f"before = {args.before} with this tree's app/sim; after = this tree ({REPO.name})")
        print(f"headless dashboard CPU-s/min, {args.runs} runs each in pairs, {args.parallel} pairs at once, "
              f"{args.seconds:g} s windows ({time.monotonic() - started:.0f} s, load {load0:.1f} -> {load1:.1f}):")
        print(f"  before {spread(b)}")
        print(f"  after  {spread(a)}")
        print(f"  after/before (medians) {statistics.median(a) / statistics.median(b):.3f}x; after lower in "
              f"{sum(1 for x, y in zip(a, b, strict=True) if x < y)} of {len(a)} pairs")
        print(f"  per run: before {', '.join(f'{x:.2f}' for x in b)}; after {', '.join(f'{x:.2f}' for x in a)}")
        if args.keys:
            if shutil.which("tmux") is None:
                print("keys: skipped, tmux is not installed")
                return
            for name, tree in trees.items():
                k = result(start(tree, args.seconds, args.presses), name)
                print(f"  {name:6s} `s` -> screen median {k['key_median_ms']:.1f} ms, p95 {k['key_p95_ms']:.1f} ms; "
                      f"in tmux {k['tmux_cpu']:.2f} CPU-s/min")


if __name__ == "__main__":
    main()
