#!/usr/bin/env python3
"""gpu_hog: a stand-in server that holds GPU memory, one child process per GPU, and serves nothing.

    python3 scripts/gpu_hog.py --mib 8192 [--gpus 0,1] [--orphan-children] [--no-cuda | --sim]
                               [--role daemon --ready-file PATH | --role engine --daemon-file PATH]

The parent starts one child per GPU in its own process group (the way SGLang starts one scheduler per
rank). Each child allocates `--mib` MiB on its GPU with torch (a plain cudaMalloc through the caching
allocator), then tells the parent through a pipe. When every rank holds its memory the parent prints

    gpu_hog: all N ranks hold M MiB (ready)

(profiles/gpu-hog.toml's ready_regex) and everybody sleeps until signalled.

--gpus      the CUDA device indices as this process sees them (default: one per entry of
            CUDA_VISIBLE_DEVICES, else 0).
--orphan-children
            children outlive their parent: `kill -9 PARENT` leaves them holding the memory, reparented to
            init but still in the group (the orphan case). Without it each child asks the kernel to kill
            it when its parent dies (PR_SET_PDEATHSIG), so killing the parent alone frees the GPUs.
--no-cuda   hold host memory instead (no torch import): for tests on machines without a GPU.
--sim       hold the memory on the simulated GPUs of $TUNEDASH_SIM_STATE (app.sim.gpu_state, as the simulated
            server's ranks do: a CUDA context of app.sim.rank_phases.CONTEXT_MIB, then --mib), so that the
            simulated host's nvidia-smi and NVML show it per pid: the whole memory loop (WARM included) on a
            machine without a GPU. CUDA_VISIBLE_DEVICES maps --gpus as on a real host.
--role      the part it plays in the weight cache layout (profiles/gpu-hog-warm.toml): "server" (default), "daemon"
            (holds the weights: started first, kept across engine relaunches) or "engine" (the daemon's client). The
            role is in every line it prints, and the ready line ends "(ready, ROLE)" for daemon and engine.
--ready-file
            (daemon) written once every rank holds its memory (`pid=P` and `mib=M` lines, by rename); removed
            when it stops on SIGTERM/SIGINT.
--daemon-file
            (engine) the daemon's ready file: the engine refuses to start (exit 1, before allocating) unless it
            names a live pid, as a weight cache client fails without its daemon.

SIGTERM or SIGINT to the parent stops the children and exits 0. A child that fails to allocate makes the
parent print the error, stop the others and exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

READY_LINE = "gpu_hog: all {ranks} ranks hold {mib} MiB (ready)"
PR_SET_PDEATHSIG = 1
ROLES = ("server", "daemon", "engine")
SIM_PROCESS_NAME = "python3"  # what the simulated nvidia-smi shows for a held allocation (the interpreter)
_ROLE = "server"


def _say(text: str) -> None:
    if _ROLE != "server":
        text = text.replace("gpu_hog:", f"gpu_hog {_ROLE}:", 1)
    print(text, flush=True)


def _sim_gpu(gpu: int) -> int:
    """The simulated host's GPU index for CUDA device `gpu` as this process sees it (CUDA_VISIBLE_DEVICES)."""
    visible = [item.strip() for item in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    return int(visible[gpu]) if gpu < len(visible) else gpu


def _hold_sim(gpu: int, mib: int) -> object:
    state = os.environ.get("TUNEDASH_SIM_STATE")
    if not state:
        raise RuntimeError("--sim needs TUNEDASH_SIM_STATE (the simulated host sets it)")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from app.sim import gpu_state
    from app.sim.rank_phases import CONTEXT_MIB

    # the CUDA context first, as torch's first allocation makes one (518 MiB a process on the H200: docs/gpus.md)
    context = gpu_state.allocate(state, _sim_gpu(gpu), CONTEXT_MIB, SIM_PROCESS_NAME, "context")
    return context, gpu_state.allocate(state, _sim_gpu(gpu), mib, SIM_PROCESS_NAME, "gpu_hog")


def _write_ready_file(path: str, mib: int) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(f"pid={os.getpid()}\nmib={mib}\n")
    os.replace(tmp, path)


def _daemon_pid(path: str) -> int | None:
    """The live pid a daemon's ready file names, else None."""
    try:
        with open(path) as fh:
            fields = dict(line.split("=", 1) for line in fh.read().splitlines() if "=" in line)
        pid = int(fields["pid"])
        os.kill(pid, 0)
    except (OSError, KeyError, ValueError):
        return None
    return pid


def _default_gpus() -> list[int]:
    visible = [item for item in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    return list(range(len(visible))) if visible else [0]


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        _say("gpu_hog: prctl(PR_SET_PDEATHSIG) unavailable; this child outlives its parent")


def run_child(rank: int, gpu: int, mib: int, ready_fd: int, no_cuda: bool, orphan: bool, sim: bool = False) -> int:
    if not orphan:
        _die_with_parent()
    held: object
    started = time.monotonic()
    try:
        if sim:
            held = _hold_sim(gpu, mib)
        elif no_cuda:
            held = bytearray(mib * 2**20)
        else:
            import torch

            held = torch.empty(mib * 2**20, dtype=torch.uint8, device=f"cuda:{gpu}")
            torch.cuda.synchronize(gpu)
    except Exception as exc:  # the parent reports it and stops the other ranks
        place = "the simulated GPU" if sim else "host" if no_cuda else f"cuda:{gpu}"
        _say(f"gpu_hog: rank {rank} could not allocate {mib} MiB on {place}: {exc}")
        return 1
    where = f"simulated GPU {_sim_gpu(gpu)}" if sim else "host memory" if no_cuda else f"cuda:{gpu}"
    _say(f"gpu_hog: rank {rank} pid {os.getpid()} holds {mib} MiB on {where} "
         f"after {time.monotonic() - started:.2f} s")
    os.write(ready_fd, b"r")
    os.close(ready_fd)  # SIGTERM keeps its default action: the child dies and the driver frees its memory
    while held is not None:
        time.sleep(3600)
    return 0


def run_parent(args: argparse.Namespace) -> int:
    gpus = [int(item) for item in args.gpus.split(",")] if args.gpus else _default_gpus()
    if args.daemon_file and _daemon_pid(args.daemon_file) is None:
        _say(f"gpu_hog: no live daemon in {args.daemon_file}; start the daemon first (--role daemon --ready-file)")
        return 1
    read_fd, write_fd = os.pipe()
    children: list[subprocess.Popen[bytes]] = []
    for rank, gpu in enumerate(gpus):
        argv = [sys.executable, os.path.abspath(__file__), "--child", str(rank), "--gpu", str(gpu),
                "--mib", str(args.mib), "--ready-fd", str(write_fd)]
        argv += ["--no-cuda"] * args.no_cuda + ["--orphan-children"] * args.orphan_children + ["--sim"] * args.sim
        argv += ["--role", args.role]
        children.append(subprocess.Popen(argv, pass_fds=(write_fd,)))  # same process group as the parent
    os.close(write_fd)
    _say(f"gpu_hog: parent pid {os.getpid()} started {len(children)} ranks: "
         + ", ".join(f"rank {r} pid {c.pid}" for r, c in enumerate(children)))

    signal.signal(signal.SIGTERM, _raise_stop)  # the handler only raises: stopping happens below, outside it
    signal.signal(signal.SIGINT, _raise_stop)
    try:
        return _hold(args, children, read_fd)
    except _Stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _stop(children, args.ready_file)
        return 0


class _Stop(BaseException):
    """SIGTERM or SIGINT arrived (raised by the handler, caught in run_parent)."""


def _raise_stop(*_: object) -> None:
    # Doing the stopping in the handler deadlocks: a signal that lands while the loop is inside Popen.poll() (which
    # holds the Popen's waitpid lock) would wait() on that lock from the same thread. Raising unwinds poll() first.
    raise _Stop


def _stop(children: list[subprocess.Popen[bytes]], ready_file: str) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        child.wait()
    if ready_file:
        with contextlib.suppress(FileNotFoundError):
            os.remove(ready_file)


def _hold(args: argparse.Namespace, children: list[subprocess.Popen[bytes]], read_fd: int) -> int:
    """Wait until every rank holds its memory, say so, then watch the ranks until one exits (or a signal)."""
    ready = 0
    while ready < len(children):
        chunk = os.read(read_fd, len(children) - ready)
        if not chunk:  # every writer closed: a rank died before it was ready
            failed = [r for r, c in enumerate(children) if c.poll() not in (None, 0)]
            _say(f"gpu_hog: rank(s) {failed or '?'} failed before holding their memory; stopping")
            for child in children:
                if child.poll() is None:
                    child.kill()
            return 1
        ready += len(chunk)
    if args.ready_file:
        _write_ready_file(args.ready_file, args.mib)
    ready_line = READY_LINE.format(ranks=len(children), mib=args.mib)
    _say(ready_line if args.role == "server" else ready_line.replace("(ready)", f"(ready, {args.role})"))
    while True:
        for rank, child in enumerate(children):
            code = child.poll()
            if code is not None:
                _say(f"gpu_hog: rank {rank} (pid {child.pid}) exited with {code}; stopping")
                _stop(children, args.ready_file)
                return 0
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Hold GPU memory, one child process per GPU.")
    parser.add_argument("--mib", type=int, default=1024, help="MiB each rank allocates (default 1024)")
    parser.add_argument("--gpus", default="", help="CUDA device indices, comma-separated")
    parser.add_argument("--orphan-children", action="store_true", help="children survive the parent's death")
    parser.add_argument("--no-cuda", action="store_true", help="hold host memory instead (tests without a GPU)")
    parser.add_argument("--sim", action="store_true", help="hold memory on the simulated GPUs ($TUNEDASH_SIM_STATE)")
    parser.add_argument("--role", choices=ROLES, default="server", help="server (default), daemon or engine")
    parser.add_argument("--ready-file", default="", help="(daemon) written once every rank holds its memory")
    parser.add_argument("--daemon-file", default="", help="(engine) the daemon's ready file; no start without it")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gpu", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ready-fd", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mib < 0:
        parser.error("--mib must be >= 0")
    if args.sim and args.no_cuda:
        parser.error("--sim and --no-cuda are two ways of holding memory; give one")
    global _ROLE
    _ROLE = args.role
    if args.child is not None:
        return run_child(args.child, args.gpu, args.mib, args.ready_fd, args.no_cuda, args.orphan_children, args.sim)
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
