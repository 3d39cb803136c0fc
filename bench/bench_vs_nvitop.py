"""tunedash's dashboard beside nvitop on the same GPUs: CPU seconds per minute of each, and the ratio.

Run (on a GPU host, a server holding memory, e.g. `tunedash launch gpu-hog --wait`):
    python3 bench/bench_vs_nvitop.py --profile profiles/gpu-hog.toml [--seconds 60] [--rounds 1]
Dry run on this machine (the simulated host; `top` stands in for nvitop, which needs NVML):
    .venv/bin/python bench/bench_vs_nvitop.py --profile demo --other 'top -d 2' --other-fast 'top -d 0.25' \
        --seconds 10

Each tool runs in a pseudo-terminal of its own (160x50, output drained as a terminal would), one at a time,
interleaved (tunedash, nvitop, tunedash, ...) so drift cannot favour one. After a 5 s settle, the CPU time of
the tool's whole process tree (utime+stime of the process and its living descendants, plus what its reaped
children used: cutime+cstime) is read from /proc over --seconds and scaled to one minute.

Two pairings, as issue 23 asks: each at its own default pace (nvitop's 2 s; tunedash samples at 4 Hz), then
both at 4 Hz (`nvitop --interval 0.25`). tunedash's pace is its default (Session.sample_period_ms = 250 ms), so
each of its variants (`--gpu-sources auto,smi`: `tunedash ui --gpu-source`, NVML in-process or nvidia-smi) is
measured once a round and set against both pairings.
Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import shlex
import signal
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
SETTLE_S = 5.0


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, own ticks, reaped children's ticks) of a process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 onwards
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return ppid, utime + stime, cutime + cstime


def tree_cpu_s(root: int) -> float:
    """CPU seconds of root, its living descendants, and the children they have reaped."""
    parents: dict[int, int] = {}
    own: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            got = _stat(int(entry))
            if got is not None:
                parents[int(entry)] = got[0]
                own[int(entry)] = (got[1], got[2])
    inside = {root}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in inside and pid not in inside:
                inside.add(pid)
                changed = True
    ticks = sum(own[pid][0] + own[pid][1] for pid in inside if pid in own)
    return ticks / TICK


class InPty:
    """A command in a pseudo-terminal of its own, its output read and thrown away as a terminal would."""

    def __init__(self, argv: list[str], env: dict[str, str], cols: int = 160, rows: int = 50) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO,
                                     start_new_session=True, close_fds=True)
        os.close(slave)
        self.master = master
        self.bytes = 0
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.bytes += len(chunk)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # tunedash gives its driver lock back on SIGTERM
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        os.close(self.master)


def measure(argv: list[str], seconds: float) -> dict[str, float]:
    env = dict(os.environ, TERM="xterm-256color", TEXTUAL_ANIMATIONS="none", COLUMNS="160", LINES="50")
    tool = InPty(argv, env)
    try:
        time.sleep(SETTLE_S)
        if tool.proc.poll() is not None:
            raise SystemExit(f"{shlex.join(argv)} exited with {tool.proc.returncode} before the window")
        before, out_before, t0 = tree_cpu_s(tool.proc.pid), tool.bytes, time.monotonic()
        time.sleep(seconds)
        after, out_after, t1 = tree_cpu_s(tool.proc.pid), tool.bytes, time.monotonic()
        if tool.proc.poll() is not None:
            raise SystemExit(f"{shlex.join(argv)} exited with {tool.proc.returncode} during the window")
    finally:
        tool.stop()
    window = t1 - t0
    return {"cpu_s_per_min": (after - before) * 60 / window, "terminal_kib_per_min": (out_after - out_before)
            * 60 / window / 1024, "window_s": window}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True, help="the profile tunedash's dashboard opens (its server running)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (medians printed)")
    parser.add_argument("--other", default="nvitop", help="the other tool at its default pace")
    parser.add_argument("--other-fast", default="nvitop --interval 0.25", help="the other tool at 4 Hz")
    parser.add_argument("--pairings", default="defaults,fast", help="which pairings, in order: defaults and/or fast")
    parser.add_argument("--gpu-sources", default="auto",
                        help="tunedash's `ui --gpu-source` values to measure, comma-separated (e.g. auto,smi)")
    args = parser.parse_args()
    chosen = [name.strip() for name in args.pairings.split(",") if name.strip()]
    if not chosen or set(chosen) - {"defaults", "fast"}:
        parser.error(f"--pairings: expected defaults and/or fast, comma-separated, got {args.pairings!r}")
    sources = [name.strip() for name in args.gpu_sources.split(",") if name.strip()]
    if not sources or set(sources) - {"auto", "nvml", "smi"}:
        parser.error(f"--gpu-sources: expected auto, nvml and/or smi, comma-separated, got {args.gpu_sources!r}")
    known = {"defaults": ("defaults (nvitop 2 s, tunedash 4 Hz)", shlex.split(args.other)),
             "fast": ("both at 4 Hz", shlex.split(args.other_fast))}
    pairings = [known[name] for name in chosen]
    # tunedash samples at 4 Hz in both pairings, so each of its variants is measured once a round and set against
    # each pairing's other tool; the runs alternate (tunedash, other, tunedash, ...) so drift favours neither
    ours: dict[str, list[float]] = {source: [] for source in sources}
    theirs: dict[str, list[float]] = {label: [] for label, _ in pairings}
    for _ in range(args.rounds):
        runs: list[tuple[str, str]] = []
        for i in range(max(len(sources), len(pairings))):
            runs += [("tunedash", sources[i])] if i < len(sources) else []
            runs += [("other", pairings[i][0])] if i < len(pairings) else []
        for kind, name in runs:
            if kind == "tunedash":
                argv = [sys.executable, "-m", "app", "ui", args.profile, "--readonly", "--gpu-source", name]
                ours[name].append(measure(argv, args.seconds)["cpu_s_per_min"])
            else:
                theirs[name].append(measure(dict(pairings)[name], args.seconds)["cpu_s_per_min"])
    results: list[dict[str, object]] = []
    for label, other in pairings:
        for source in sources:
            mine, its = statistics.median(ours[source]), statistics.median(theirs[label])
            row = {"pairing": label, "gpu_source": source, "other": shlex.join(other), "tunedash_cpu_s_per_min": mine,
                   "other_cpu_s_per_min": its, "tunedash_rounds": ours[source], "other_rounds": theirs[label],
                   "ratio_tunedash_over_other": mine / its if its else float("inf")}
            results.append(row)
            print(f"{label:38} tunedash ({source:4}) {mine:6.2f} CPU-s/min   {shlex.join(other):24} {its:6.2f} "
                  f"CPU-s/min   ratio {row['ratio_tunedash_over_other']:.2f}", flush=True)
    print(json.dumps({"seconds": args.seconds, "rounds": args.rounds, "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
