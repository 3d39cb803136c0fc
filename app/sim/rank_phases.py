"""One simulated TP rank's scheduler: its config, its log lines and GPU memory, and the startup phases both
releases share (the CUDA context, weights, the KV pool). app.sim.rank runs it; app.sim.startup_0523 speaks 0.5.23's
startup through it."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from app.sim import gpu_state
from app.sim.simlog import log, raw, stamp
from app.sim.tracebacks import crash_loading_traceback, oom_traceback

GIB = 1024.0
CONTEXT_MIB = 514


class RankPhases:
    """The scheduler of one TP rank: its state and the phases both releases share."""

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

    # ------------------------------------------------------------------ the phases
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
