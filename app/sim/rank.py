"""One simulated SGLang child process: a TP-rank scheduler holding GPU memory in phases, or the detokenizer.

The startup lines follow the release spoken (config "running"): 0.5.10's here, 0.5.23's in
app.sim.startup_0523; the phases both share, and the rank's state, in app.sim.rank_phases.

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

from app.sim import gpu_state, startup_0523
from app.sim.rank_phases import GIB, RankPhases
from app.sim.tracebacks import capture_oom_traceback


def set_process_name(name: str) -> None:
    """prctl(PR_SET_NAME): `ps -o comm` shows the first 15 characters (`sglang::schedul`)."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Rank(RankPhases):
    """The scheduler of one TP rank, starting as its release logs it."""

    def run(self) -> None:
        tokens = startup_0523.start(self) if self.running["version"] == "0.5.23" else self.start_0510()
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
