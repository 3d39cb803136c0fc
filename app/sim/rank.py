"""One simulated SGLang child process: a TP-rank scheduler holding GPU memory in phases, or the detokenizer.

The startup lines follow the release spoken (config "running"): 0.5.10's here, 0.5.23's in
app.sim.startup_0523.

Started by app.sim.sglang as `python -m app.sim.rank '<json config>'` with a status pipe fd; it stays in the
launcher's process group (never setsid) and sets no PDEATHSIG, so when the main process is SIGKILLed alone
the ranks are orphaned and keep their memory, like real SGLang schedulers reparented to PID 1.
SIGTERM is ignored while the original parent lives (the main process drains, then SIGKILLs its children);
an orphaned rank exits on SIGTERM. Fault knobs (config "faults"): crash_loading, oom_capture, never_release.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from typing import Any

from app.sim import gpu_state
from app.sim.simlog import log, raw, stamp
from app.sim.tracebacks import capture_oom_traceback, crash_loading_traceback, oom_traceback

GIB = 1024.0
CONTEXT_MIB = 514


def set_process_name(name: str) -> None:
    """prctl(PR_SET_NAME): `ps -o comm` shows the first 15 characters (`sglang::schedul`)."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Rank:
    """The scheduler of one TP rank."""

    def __init__(self, cfg: dict[str, Any], status_fd: int) -> None:
        self.cfg = cfg
        self.args: dict[str, Any] = cfg["args"]
        self.model: dict[str, Any] = cfg["model"]
        self.phases: dict[str, float] = cfg["phases"]
        self.running: dict[str, Any] = cfg["running"]  # app.sim.resolved.Running, as a dict
        self.status_fd = status_fd
        self.state = cfg["state_dir"]
        self.gpu = int(cfg["gpu"])
        self.tp_rank = int(cfg["tp_rank"])
        self.tp = int(cfg["tp_size"])
        self.prefix = f" TP{self.tp_rank}" if self.tp > 1 else ""
        self.name = cfg["name"]
        self.faults: list[str] = cfg.get("faults", [])
        self.total_mib = int(cfg["gpu_total_mib"])

    def say(self, msg: str) -> None:
        log(msg, self.prefix)

    def status(self, word: str) -> None:
        try:
            os.write(self.status_fd, f"{self.tp_rank} {word}\n".encode())
        except OSError:
            pass

    def avail_gb(self) -> float:
        return gpu_state.free_mib(self.state, self.gpu) / GIB

    def hold(self, mib: float, phase: str) -> None:
        gpu_state.allocate(self.state, self.gpu, int(mib), self.name, phase, leaked="never_release" in self.faults)

    def fail(self, lines: list[str]) -> None:
        raw("".join(lines))
        self.status("failed")
        sys.exit(1)

    @property
    def spec_graphs(self) -> bool:
        """EAGLE-type speculation: a draft model with graphs of its own."""
        algo = self.args["speculative_algorithm"]
        return bool(algo) and algo != "NGRAM"

    # ------------------------------------------------------------------ phases both releases share
    def init_context(self) -> float:
        """The CUDA context and NCCL set-up; the GB it took."""
        time.sleep(self.phases["init"])
        before = self.avail_gb()
        self.hold(CONTEXT_MIB, "context")
        return before - self.avail_gb()

    def load_weights(self, weights_mib: float, seconds: float, architecture: str, dtype_part: str) -> None:
        """`Load weight begin/end`, holding the weights in a few chunks so a sampler sees them grow."""
        start_avail = self.avail_gb()
        self.say(f"Load weight begin. avail mem={start_avail:.2f} GB")
        chunks = 4
        t0 = time.time()
        for i in range(chunks):
            time.sleep(seconds / chunks)
            if i == 1 and "crash_loading" in self.faults and self.tp_rank == 0:
                self.fail(crash_loading_traceback(self.prefix, self.cfg["model_path"]))
            try:
                self.hold(weights_mib / chunks, "weights")
            except gpu_state.OutOfMemory as exc:
                self.fail(oom_traceback(self.prefix, exc, weights_mib / chunks, "load"))
        end_avail = self.avail_gb()
        self.say(
            f"Load weight end. elapsed={time.time() - t0:.2f} s, type={architecture}, "
            f"{dtype_part}avail mem={end_avail:.2f} GB, mem usage={start_avail - end_avail:.2f} GB."
        )

    def allocate_pool(self, weights_mib: float) -> tuple[float, float, int]:
        """Hold the KV cache and mamba state (mem_fraction_static x total covers them and the weights):
        (kv MiB, mamba MiB, token capacity)."""
        time.sleep(self.phases["kv"])
        pool_mib = self.args["mem_fraction_static"] * self.total_mib - weights_mib - CONTEXT_MIB
        mamba_mib = self.model.get("mamba_cache_gib", 0) * GIB
        kv_mib = pool_mib - mamba_mib
        if kv_mib <= 256:
            self.fail([f"[{stamp()}{self.prefix}] Scheduler hit an exception: Traceback (most recent call last):\n",
                       "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"])
        tokens = int(kv_mib * 1024 / (self.model["kv_kib_per_token"] / self.tp))
        return kv_mib, mamba_mib, tokens

    def hold_pool(self, kv_mib: float, mamba_mib: float) -> None:
        try:
            self.hold(kv_mib, "kv_cache")
            if mamba_mib:
                self.hold(mamba_mib, "mamba_cache")
        except gpu_state.OutOfMemory as exc:
            self.fail(oom_traceback(self.prefix, exc, kv_mib, "pool"))

    def mamba_line(self, mamba_mib: float, extra: str = "") -> str:
        conv = mamba_mib / GIB * 0.04
        return (f"Mamba Cache is allocated. max_mamba_cache_size: {self.model['max_mamba_cache_size']}, "
                f"conv_state size: {conv:.2f}GB, ssm_state size: {mamba_mib / GIB - conv:.2f}GB {extra}")

    def capacity_line(self, tokens: int) -> None:
        """Rank 0's summary before the scheduler serves."""
        if self.tp_rank == 0:
            self.say(
                f"max_total_num_tokens={tokens}, chunked_prefill_size={self.args['chunked_prefill_size']}, "
                f"max_prefill_tokens=16384, max_running_requests={self.args['max_running_requests']}, "
                f"context_len={self.args['context_length']}, available_gpu_mem={self.avail_gb():.2f} GB"
            )

    def run(self) -> None:
        if self.running["version"] == "0.5.23":
            from app.sim import startup_0523

            tokens = startup_0523.start(self)
        else:
            tokens = self.start_0510()
        self.capacity_line(tokens)
        self.status(f"ready {tokens}")

    # ------------------------------------------------------------------ 0.5.10
    def start_0510(self) -> int:
        """0.5.10's startup lines: torch.distributed, weights, KV cache, graphs. The token capacity."""
        self.say("Init torch distributed begin.")
        used = self.init_context()
        self.say(f"Init torch distributed ends. elapsed={self.phases['init']:.2f} s, mem usage={used:.2f} GB")
        weights_mib = self.model["weights_gib"] * GIB / self.tp
        self.load_weights(weights_mib, self.phases["weights"], self.model["architecture"],
                          f"dtype=torch.{self.model['dtype']}, ")
        kv_mib, mamba_mib, tokens = self.allocate_pool(weights_mib)
        self.say(f"Using KV cache dtype: torch.{self.model['dtype']}")
        self.say(f"The available memory for KV cache is {kv_mib / GIB:.2f} GB.")
        self.hold_pool(kv_mib, mamba_mib)
        half = kv_mib / GIB / 2
        self.say(f"KV Cache is allocated. #tokens: {tokens}, K size: {half:.2f} GB, V size: {half:.2f} GB")
        if mamba_mib:
            self.say(self.mamba_line(mamba_mib))
        self.say(f"Memory pool end. avail mem={self.avail_gb():.2f} GB")

        running = self.running
        if running["decode_graph"]:
            self.capture("cuda", self.phases["graph"], 620 + 20 * running["graph_max_bs"] // 8)
        if self.spec_graphs:
            self.capture("draft cuda", self.phases["draft_graph"] / 2, 180)
            self.capture("draft extend cuda", self.phases["draft_graph"] / 2, 120)
        if running["prefill_graph_off_by_flag"]:
            self.say("Disable piecewise CUDA graph because --disable-piecewise-cuda-graph is set")
        elif running["prefill_graph"]:
            self.capture("piecewise CUDA", self.phases["piecewise"], 410)
        return tokens

    def capture(self, kind: str, seconds: float, mib: int) -> None:
        """One 0.5.10 capture: `Capture {kind} graph begin. ...` / `... end. Time elapsed: ...`."""
        before = self.avail_gb()
        t0 = time.time()
        if kind == "piecewise CUDA":
            self.say(f"Capture piecewise CUDA graph begin. avail mem={before:.2f} GB")
            limit = self.running["prefill_graph_max_tokens"]
            sizes = [n for n in (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192) if n <= limit]
            self.say(f"Capture cuda graph num tokens {sizes}")
            self.say(f"Compiling a graph for dynamic shape takes {seconds * 0.4:.2f} s")
        else:
            self.say(f"Capture {kind} graph begin. This can take up to several minutes. avail mem={before:.2f} GB")
            if kind == "cuda":
                bs = [b for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 96, 128, 160, 192, 224, 256, 512)
                      if b <= self.running["graph_max_bs"]]
                self.say(f"Capture cuda graph bs {bs}")
        time.sleep(seconds)
        if kind == "cuda" and "oom_capture" in self.faults:
            free = gpu_state.free_mib(self.state, self.gpu)
            self.fail(capture_oom_traceback(self.prefix, free, self.total_mib))
        try:
            self.hold(mib, "cuda_graph")
        except gpu_state.OutOfMemory:
            self.fail(capture_oom_traceback(self.prefix, gpu_state.free_mib(self.state, self.gpu), self.total_mib))
        after = self.avail_gb()
        self.say(
            f"Capture {kind} graph end. Time elapsed: {time.time() - t0:.2f} s. mem usage={before - after:.2f} GB. "
            f"avail mem={after:.2f} GB."
        )


def idle_forever(parent: int) -> None:
    def on_term(signum: int, frame: object) -> None:
        if os.getppid() != parent:  # orphaned: nobody will SIGKILL us in order
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        time.sleep(3600)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    status_fd = int(sys.argv[2])
    parent = os.getppid()
    set_process_name(cfg["name"])
    # Until ready, SIGTERM from a group kill is ignored like after ready (the main process decides).
    signal.signal(signal.SIGTERM, lambda s, f: None if os.getppid() == parent else os._exit(0))
    if cfg["role"] == "scheduler":
        Rank(cfg, status_fd).run()
    idle_forever(parent)


if __name__ == "__main__":
    main()
