"""One simulated SGLang child process: a TP-rank scheduler holding GPU memory in phases, or the detokenizer.

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
from app.sim.simlog import log, raw

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
        self.status_fd = status_fd
        self.state = cfg["state_dir"]
        self.gpu = int(cfg["gpu"])
        self.tp_rank = int(cfg["tp_rank"])
        self.prefix = f" TP{self.tp_rank}" if cfg["tp_size"] > 1 else ""
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

    def run(self) -> None:
        cfg, args, model = self.cfg, self.cfg["args"], self.cfg["model"]
        phases = cfg["phases"]
        tp = args["tp_size"]
        self.say("Init torch distributed begin.")
        time.sleep(phases["init"])
        before = self.avail_gb()
        self.hold(CONTEXT_MIB, "context")
        used = before - self.avail_gb()
        self.say(f"Init torch distributed ends. elapsed={phases['init']:.2f} s, mem usage={used:.2f} GB")

        # Weights, in a few chunks so a sampler sees them grow.
        weights_mib = model["weights_gib"] * GIB / tp
        start_avail = self.avail_gb()
        self.say(f"Load weight begin. avail mem={start_avail:.2f} GB")
        chunks = 4
        t0 = time.time()
        for i in range(chunks):
            time.sleep(phases["weights"] / chunks)
            if i == 1 and "crash_loading" in self.faults and self.tp_rank == 0:
                self.fail(crash_loading_traceback(self.prefix, cfg["model_path"]))
            try:
                self.hold(weights_mib / chunks, "weights")
            except gpu_state.OutOfMemory as exc:
                self.fail(oom_traceback(self.prefix, exc, weights_mib / chunks, "load"))
        end_avail = self.avail_gb()
        self.say(
            f"Load weight end. elapsed={time.time() - t0:.2f} s, type={model['architecture']}, "
            f"dtype=torch.{model['dtype']}, avail mem={end_avail:.2f} GB, mem usage={start_avail - end_avail:.2f} GB."
        )

        # Memory pool: mem_fraction_static x total covers weights + KV (+ mamba state).
        time.sleep(phases["kv"])
        pool_mib = args["mem_fraction_static"] * self.total_mib - weights_mib - CONTEXT_MIB
        mamba_mib = model.get("mamba_cache_gib", 0) * GIB
        kv_mib = pool_mib - mamba_mib
        if kv_mib <= 256:
            self.fail([f"[{_ts()}{self.prefix}] Scheduler hit an exception: Traceback (most recent call last):\n",
                       "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"])
        tokens = int(kv_mib * 1024 / (model["kv_kib_per_token"] / tp))
        self.say(f"Using KV cache dtype: torch.{model['dtype']}")
        self.say(f"The available memory for KV cache is {kv_mib / GIB:.2f} GB.")
        try:
            self.hold(kv_mib, "kv_cache")
            if mamba_mib:
                self.hold(mamba_mib, "mamba_cache")
        except gpu_state.OutOfMemory as exc:
            self.fail(oom_traceback(self.prefix, exc, kv_mib, "pool"))
        half = kv_mib / GIB / 2
        self.say(f"KV Cache is allocated. #tokens: {tokens}, K size: {half:.2f} GB, V size: {half:.2f} GB")
        if mamba_mib:
            conv = mamba_mib / GIB * 0.04
            self.say(
                f"Mamba Cache is allocated. max_mamba_cache_size: {model['max_mamba_cache_size']}, "
                f"conv_state size: {conv:.2f}GB, ssm_state size: {mamba_mib / GIB - conv:.2f}GB "
            )
        self.say(f"Memory pool end. avail mem={self.avail_gb():.2f} GB")

        if not args["disable_cuda_graph"]:
            self.capture("cuda", phases["graph"], 620 + 20 * args["cuda_graph_max_bs"] // 8, args)
        if args["speculative_algorithm"] and args["speculative_algorithm"] != "NGRAM":
            self.capture("draft cuda", phases["draft_graph"] / 2, 180, args)
            self.capture("draft extend cuda", phases["draft_graph"] / 2, 120, args)
        if args["_user_disabled_pcg"]:
            self.say("Disable piecewise CUDA graph because --disable-piecewise-cuda-graph is set")
        elif args["enable_piecewise_cuda_graph"]:
            self.capture("piecewise CUDA", phases["piecewise"], 410, args)

        if self.tp_rank == 0:
            self.say(
                f"max_total_num_tokens={tokens}, chunked_prefill_size={args['chunked_prefill_size']}, "
                f"max_prefill_tokens=16384, max_running_requests={args['max_running_requests']}, "
                f"context_len={args['context_length']}, available_gpu_mem={self.avail_gb():.2f} GB"
            )
        self.status(f"ready {tokens}")

    def capture(self, kind: str, seconds: float, mib: int, args: dict[str, Any]) -> None:
        before = self.avail_gb()
        t0 = time.time()
        if kind == "piecewise CUDA":
            self.say(f"Capture piecewise CUDA graph begin. avail mem={before:.2f} GB")
            limit = args["piecewise_cuda_graph_max_tokens"]
            sizes = [n for n in (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192) if n <= limit]
            self.say(f"Capture cuda graph num tokens {sizes}")
            self.say(f"Compiling a graph for dynamic shape takes {seconds * 0.4:.2f} s")
        else:
            self.say(f"Capture {kind} graph begin. This can take up to several minutes. avail mem={before:.2f} GB")
            if kind == "cuda":
                bs = [b for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 96, 128, 160, 192, 224, 256, 512)
                      if b <= args["cuda_graph_max_bs"]]
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


def _ts() -> str:
    from app.sim.simlog import stamp

    return stamp()


def crash_loading_traceback(prefix: str, model_path: str) -> list[str]:
    shard = "model-00004-of-00011.safetensors"
    return [
        f"[{_ts()}{prefix}] Scheduler hit an exception: Traceback (most recent call last):\n",
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 2996, '
        "in run_scheduler_process\n",
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)\n",
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_loader/loader.py", line 455, '
        "in load_weights_and_postprocess\n",
        "    model.load_weights(weights)\n",
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_loader/weight_utils.py", line 661, '
        "in safetensors_weights_iterator\n",
        "    with safe_open(st_file, framework=\"pt\") as f:\n",
        "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer\n",
        f"(while loading {model_path}/{shard})\n",
    ]


def oom_traceback(prefix: str, exc: gpu_state.OutOfMemory, want_mib: float, where: str) -> list[str]:
    gpu = exc.gpu
    return [
        f"[{_ts()}{prefix}] Scheduler hit an exception: Traceback (most recent call last):\n",
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 2996, '
        "in run_scheduler_process\n",
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {want_mib / GIB:.2f} GiB. "
        f"GPU {gpu.index} has a total capacity of {gpu.memory_total_mib / GIB:.2f} GiB of which "
        f"{max(exc.free_mib, 0):.2f} MiB is free. Of the allocated memory {where} ...\n",
    ]


def capture_oom_traceback(prefix: str, free_mib: int, total_mib: int) -> list[str]:
    want = 1.53
    oom = (
        f"CUDA out of memory. Tried to allocate {want:.2f} GiB. GPU 0 has a total capacity of "
        f"{total_mib / GIB:.2f} GiB of which {min(free_mib, 300):.2f} MiB is free."
    )
    return [
        f"[{_ts()}{prefix}] Scheduler hit an exception: Traceback (most recent call last):\n",
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/cuda_graph_runner.py", '
        "line 412, in __init__\n",
        "    self.capture()\n",
        f"torch.OutOfMemoryError: {oom}\n",
        "\n",
        "During handling of the above exception, another exception occurred:\n",
        "\n",
        "Traceback (most recent call last):\n",
        f"Exception: Capture cuda graph failed: {oom}\n",
        "Possible solutions:\n",
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n",
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n",
        "3. disable torch compile by not using --enable-torch-compile\n",
        "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n",
    ]


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
