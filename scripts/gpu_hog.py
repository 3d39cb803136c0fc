#!/usr/bin/env python3
"""gpu_hog: a stand-in server that holds GPU memory, one child process per GPU, and serves nothing.

    python3 scripts/gpu_hog.py --mib 8192 [--gpus 0,1] [--orphan-children] [--no-cuda]

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

SIGTERM or SIGINT to the parent stops the children and exits 0. A child that fails to allocate makes the
parent print the error, stop the others and exit 1.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

READY_LINE = "gpu_hog: all {ranks} ranks hold {mib} MiB (ready)"
PR_SET_PDEATHSIG = 1


def _say(text: str) -> None:
    print(text, flush=True)


def _default_gpus() -> list[int]:
    visible = [item for item in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    return list(range(len(visible))) if visible else [0]


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        _say("gpu_hog: prctl(PR_SET_PDEATHSIG) unavailable; this child outlives its parent")


def run_child(rank: int, gpu: int, mib: int, ready_fd: int, no_cuda: bool, orphan: bool) -> int:
    if not orphan:
        _die_with_parent()
    held: object
    started = time.monotonic()
    try:
        if no_cuda:
            held = bytearray(mib * 2**20)
        else:
            import torch

            held = torch.empty(mib * 2**20, dtype=torch.uint8, device=f"cuda:{gpu}")
            torch.cuda.synchronize(gpu)
    except Exception as exc:  # the parent reports it and stops the other ranks
        _say(f"gpu_hog: rank {rank} could not allocate {mib} MiB on {'host' if no_cuda else f'cuda:{gpu}'}: {exc}")
        return 1
    where = "host memory" if no_cuda else f"cuda:{gpu}"
    _say(f"gpu_hog: rank {rank} pid {os.getpid()} holds {mib} MiB on {where} "
         f"after {time.monotonic() - started:.2f} s")
    os.write(ready_fd, b"r")
    os.close(ready_fd)  # SIGTERM keeps its default action: the child dies and the driver frees its memory
    while held is not None:
        time.sleep(3600)
    return 0


def run_parent(args: argparse.Namespace) -> int:
    gpus = [int(item) for item in args.gpus.split(",")] if args.gpus else _default_gpus()
    read_fd, write_fd = os.pipe()
    children: list[subprocess.Popen[bytes]] = []
    for rank, gpu in enumerate(gpus):
        argv = [sys.executable, os.path.abspath(__file__), "--child", str(rank), "--gpu", str(gpu),
                "--mib", str(args.mib), "--ready-fd", str(write_fd)]
        argv += ["--no-cuda"] * args.no_cuda + ["--orphan-children"] * args.orphan_children
        children.append(subprocess.Popen(argv, pass_fds=(write_fd,)))  # same process group as the parent
    os.close(write_fd)
    _say(f"gpu_hog: parent pid {os.getpid()} started {len(children)} ranks: "
         + ", ".join(f"rank {r} pid {c.pid}" for r, c in enumerate(children)))

    def stop(*_: object) -> None:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            child.wait()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
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
    _say(READY_LINE.format(ranks=len(children), mib=args.mib))
    while True:
        for rank, child in enumerate(children):
            code = child.poll()
            if code is not None:
                _say(f"gpu_hog: rank {rank} (pid {child.pid}) exited with {code}; stopping")
                stop()
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Hold GPU memory, one child process per GPU.")
    parser.add_argument("--mib", type=int, default=1024, help="MiB each rank allocates (default 1024)")
    parser.add_argument("--gpus", default="", help="CUDA device indices, comma-separated")
    parser.add_argument("--orphan-children", action="store_true", help="children survive the parent's death")
    parser.add_argument("--no-cuda", action="store_true", help="hold host memory instead (tests without a GPU)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gpu", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ready-fd", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mib < 0:
        parser.error("--mib must be >= 0")
    if args.child is not None:
        return run_child(args.child, args.gpu, args.mib, args.ready_fd, args.no_cuda, args.orphan_children)
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
