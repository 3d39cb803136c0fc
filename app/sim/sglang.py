"""The simulated SGLang server: `python -m app.sim.sglang --model-path sim/qwen3.6-27b --tp-size 2 ...`.

It speaks one SGLang release (app.sim.versions: 0.5.10, the default, or 0.5.23): that release's real flags
(anything else exits 2 with argparse's real message; `--help` prints the release's real help text), its
rules (app.sim.rules_0510, app.sim.rules_0523), its startup and decode lines, and its `version` in
/get_server_info. `__version__` is that release, as `sglang.__version__` is for the real package.

Process tree like SGLang's: this main process (tokenizer manager + HTTP) starts `sglang::detokenizer` and
one `sglang::scheduler_TP<n>` per tensor-parallel rank (app/sim/rank.py), all in the launcher's process
group. The ranks hold simulated GPU memory (app/sim/gpu_state.py) in phases; logs go to stdout/stderr in
SGLang's format. HTTP (aiohttp): /health, /health_generate, /get_server_info (+ /server_info),
/get_model_info, /v1/models, /v1/completions, /v1/chat/completions (SSE streaming), /generate,
/metrics (only with --enable-metrics).

Environment:
    TUNEDASH_SIM_STATE      state folder of the simulated host (default: host_env.default_state_dir())
    TUNEDASH_SIM_SGLANG_VERSION  the release spoken: 0.5.10 (default) or 0.5.23
    TUNEDASH_SIM_STARTUP_S  total startup time in seconds (default: host.json "startup_s", else 6.0)
    TUNEDASH_SIM_TIMING     "seed": the seed model's real phase times (SEED_PHASES) instead of shares of the startup
    TUNEDASH_SIM_FAULT      comma-separated faults: crash_loading (rank 0 dies while loading weights with a
                            traceback), oom_capture (CUDA OOM at CUDA graph capture), never_release (the
                            ranks' allocation records are flagged leaked: kept after the ranks die)
    SGLANG_ENABLE_SPEC_V2   as in SGLang 0.5.10 (default False: overlap scheduler off with EAGLE); 0.5.23
                            has no spec v1 (overlap on with EAGLE unless --disable-overlap-schedule)
An unknown --model-path fails like SGLang (OSError from the config loader, exit 1); models.toml lists the
known ones. "Address already in use" is real: the port is bound after loading, like uvicorn does.
--weight-cache-mode client: the ranks map the target's weights from the simulated weight cache daemon
(app.sim.weight_cache, app.sim.ipc_client) and a scheduler that dies takes the server down (SubprocessWatchdog).
SIGTERM: log, drain (503 on /health) until no request is in flight (max 5 s), SIGKILL the children, exit 0.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.sim import gpu_state
from app.sim.engine import Engine
from app.sim.host_env import FAULT_ENV, STARTUP_ENV, init_state
from app.sim.http_api import build_app
from app.sim.placement import InvalidDeviceOrdinal, gpu_speed_factors, rank_gpus, server_speed_factor
from app.sim.resolved import Resolved, Running
from app.sim.server_args import load_models, parse, resolve, server_args_repr
from app.sim.simlog import log, raw
from app.sim.speed import SpeedConfig, SpeedModel
from app.sim.versions import UnknownVersion, current_version, version_from_env

__version__ = version_from_env()

DEFAULT_STARTUP_S = 6.0
PHASE_SHARES = {"pre": 0.03, "init": 0.05, "weights": 0.45, "kv": 0.08, "graph": 0.17, "draft_graph": 0.06,
                "piecewise": 0.10, "warmup": 0.06}
TIMING_ENV = "TUNEDASH_SIM_TIMING"
# TUNEDASH_SIM_TIMING=seed: the seed model's real phase times in seconds (tests/data/logs/sglang_0523_startup.log:
# weights 31.12 s, verify graph 12.41 s, the draft's or the prefill graph 3.9 s, READY at about 58 s).
SEED_PHASES = {"pre": 4.0, "init": 2.5, "weights": 31.1, "kv": 1.5, "graph": 12.4, "draft_graph": 3.9,
               "piecewise": 3.9, "warmup": 2.6}
IPC_LOAD_SHARE = 0.03  # the client's load from the daemon, as a share of the disk load (seed timing: 0.9 s)
SEED_IPC_LOAD_S = 0.9
WATCHDOG_INTERVAL_S = 1.0  # utils/watchdog.py SubprocessWatchdog's default interval


def phase_seconds(startup_s: float) -> dict[str, float]:
    """Seconds per startup phase: shares of `startup_s`, or the seed's real times under TUNEDASH_SIM_TIMING=seed."""
    if os.environ.get(TIMING_ENV) == "seed":
        return {**SEED_PHASES, "ipc_weights": SEED_IPC_LOAD_S}
    phases = {k: v * startup_s for k, v in PHASE_SHARES.items()}
    phases["ipc_weights"] = phases["weights"] * IPC_LOAD_SHARE
    return phases


def uvicorn(level: str, msg: str) -> None:
    log(f"{(level + ':').ljust(9)} {msg}")


class SimServer:
    """The main process: children, HTTP, engine, signals."""

    def __init__(self, resolved: Resolved, model: dict[str, Any], state_dir: Path, startup_s: float,
                 faults: list[str], gpu_speed: dict[int, float] | None = None) -> None:
        self.args = resolved.args
        self.gpu_speed = gpu_speed or {}
        self.gpus: list[int] = []
        self.running: Running = resolved.running
        self.model = model
        self.state_dir = state_dir
        self.phases = phase_seconds(startup_s)
        self.faults = faults
        self.children: list[subprocess.Popen[bytes]] = []
        self.status = "Starting"
        self.max_total_tokens = 0
        self.engine: Engine | None = None
        self.stop = asyncio.Event()
        self.exit_code = 0

    # ------------------------------------------------------------------ children
    def spawn(self, role: str, name: str, tp_rank: int, gpu: int, status_w: int, total_mib: int) -> None:
        cfg = {"role": role, "name": name, "tp_rank": tp_rank, "tp_size": self.args["tp_size"], "gpu": gpu,
               "state_dir": str(self.state_dir), "args": self.args, "running": asdict(self.running),
               "model": self.model, "phases": self.phases,
               "faults": self.faults, "model_path": self.args["model_path"], "gpu_total_mib": total_mib}
        proc = subprocess.Popen([sys.executable, "-m", "app.sim.rank", json.dumps(cfg), str(status_w)],
                                pass_fds=(status_w,), stdin=subprocess.DEVNULL)
        self.children.append(proc)

    def kill_children(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
        for proc in self.children:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def die_with_children(self) -> None:
        """SGLang's kill_process_tree(own pid): SIGKILL the children, then this process."""
        self.kill_children()
        os.kill(os.getpid(), signal.SIGKILL)

    async def start_children(self) -> bool:
        config = gpu_state.read_host_config(self.state_dir)
        tp = self.args["tp_size"]
        base = self.args["base_gpu_id"]
        try:
            self.gpus = rank_gpus(tp, base, len(config.gpus))
        except InvalidDeviceOrdinal:
            raw("RuntimeError: CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously "
                "reported at some other API call, so the stacktrace below might be incorrect.\n")
            return False
        r, w = os.pipe()
        first = self.gpus[0]
        self.spawn("detokenizer", "sglang::detokenizer", 0, first, w, config.gpus[first].memory_total_mib)
        for rank, gpu in enumerate(self.gpus):
            name = f"sglang::scheduler_TP{rank}" if tp > 1 else "sglang::scheduler"
            self.spawn("scheduler", name, rank, gpu, w, config.gpus[gpu].memory_total_mib)
        os.close(w)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(r, "rb", buffering=0))
        ready: dict[int, int] = {}
        try:
            while len(ready) < tp:
                try:
                    line = await asyncio.wait_for(reader.readline(), 0.1)
                except TimeoutError:
                    if any(p.poll() is not None for p in self.children) or self.stop.is_set():
                        return False
                    continue
                if not line:
                    return False
                rank_s, word, *rest = line.decode().split()
                if word != "ready":
                    return False
                ready[int(rank_s)] = int(rest[0])
        finally:
            transport.close()
        self.max_total_tokens = ready[0]
        return True

    async def watch_children(self) -> None:
        """SGLang's SubprocessWatchdog: a scheduler that died (a weight cache client whose daemon died SIGKILLs
        itself) takes the server down: the real error line, then the sigquit handler's kill of the tree."""
        schedulers = self.children[1:]
        while not self.stop.is_set():
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            for i, proc in enumerate(schedulers):
                code = proc.poll()
                if code is None or code == 0:
                    continue
                log(f"Subprocess scheduler_{i} (pid={proc.pid}) crashed with exit code {code}. "
                    "Triggering SIGQUIT for cleanup...")
                log("Received sigquit from a child process. It usually means the child failed.")
                self.die_with_children()

    # ------------------------------------------------------------------ signals
    def on_sigterm(self) -> None:
        log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        if self.status == "Starting":
            self.stop.set()
            return
        self.status = "Draining"
        asyncio.get_running_loop().create_task(self.drain())

    async def drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        await asyncio.sleep(0.2)
        while self.engine is not None and self.engine.in_flight and loop.time() < deadline:
            rids = [r.rid for r in self.engine.running + self.engine.waiting]
            log(f"Gracefully exiting... Remaining number of requests {len(rids)}. Remaining requests "
                f"remaining_rids={rids}.")
            await asyncio.sleep(0.5)
        self.stop.set()

    # ------------------------------------------------------------------ main
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.on_sigterm)
        loop.add_signal_handler(signal.SIGINT, self.stop.set)
        await asyncio.sleep(self.phases["pre"])
        if not await self.start_children():
            if self.stop.is_set():
                self.kill_children()
                return 0
            log("Received sigquit from a child process. It usually means the child failed.")
            self.die_with_children()
        speed = SpeedModel(speed_config(Resolved(self.args, self.running), self.model),
                           gpu_factor=server_speed_factor(self.gpus, self.gpu_speed))
        state = os.environ.get("TUNEDASH_SIM_STATE")
        busy = os.path.join(state, "busy") if state else None
        self.engine = Engine(self.args, self.running, speed, self.max_total_tokens, busy)
        self.engine.start()
        from aiohttp import web

        app = build_app(self)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        uvicorn("INFO", f"Started server process [{os.getpid()}]")
        uvicorn("INFO", "Waiting for application startup.")
        uvicorn("INFO", "Application startup complete.")
        host, port = self.args["host"], self.args["port"]
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            uvicorn("ERROR", f"[Errno 98] error while attempting to bind on address ('{host}', {port}): "
                             "address already in use")
            uvicorn("INFO", "Waiting for application shutdown.")
            uvicorn("INFO", "Application shutdown complete.")
            self.kill_children()
            return 1
        uvicorn("INFO", f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
        if not self.args["skip_server_warmup"]:
            await asyncio.sleep(self.phases["warmup"])
            from app.sim.engine import SimRequest

            req = SimRequest(rid="warmup", prompt_tokens=6, max_tokens=1)
            self.engine.submit(req)
            while await req.chunks.get() is not None:
                pass
            uvicorn("INFO", f'{host}:{port + 1000} - "POST /generate HTTP/1.1" 200 OK')
        if not self.stop.is_set():
            self.status = "Up"
            log("The server is fired up and ready to roll!")
        watchdog = asyncio.get_running_loop().create_task(self.watch_children())
        await self.stop.wait()
        watchdog.cancel()
        self.status = "Draining"
        await self.engine.stop()
        await runner.cleanup()
        self.kill_children()
        return self.exit_code


def speed_config(resolved: Resolved, model: dict[str, Any]) -> SpeedConfig:
    """What the speed model looks at: the same words for every release (Running), plus the speculation."""
    args, running = resolved.args, resolved.running
    return SpeedConfig(
        weights_gib=float(model["weights_gib"]),
        tp_size=int(args["tp_size"]),
        spec_algorithm=args["speculative_algorithm"],
        spec_steps=int(args["speculative_num_steps"] or 0),
        spec_topk=int(args["speculative_eagle_topk"] or 1),
        spec_draft_tokens=int(args["speculative_num_draft_tokens"] or 0),
        cuda_graph=running.decode_graph,
        cuda_graph_max_bs=running.graph_max_bs,
        piecewise_cuda_graph=running.prefill_graph,
        single_batch_overlap=running.single_batch_overlap,
        overlap_schedule=running.overlap_schedule,
        torch_compile=running.torch_compile,
    )


def startup_seconds(state_dir: Path) -> float:
    env = os.environ.get(STARTUP_ENV)
    if env:
        return float(env)
    configured = gpu_state.read_host_config(state_dir).startup_s
    return float(configured) if configured is not None else DEFAULT_STARTUP_S


def unknown_model(path: str) -> int:
    raw(
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py", line 29, in <module>\n'
        "    server_args = prepare_server_args(sys.argv[1:])\n"
        f"OSError: {path} is not a local folder and is not a valid model identifier listed on "
        "'https://huggingface.co/models'\n"
        "If this is a private repository, make sure to pass a token having permission to this repo either by "
        "logging in with `hf auth login` or by passing `token=<your_token>`\n"
    )
    return 1


ENTRYPOINT_WARNING = (  # 0.5.23's sglang/launch_server.py, a warnings.warn under `if __name__ == "__main__":`
    "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py:71: UserWarning: 'python -m "
    "sglang.launch_server' is still supported, but 'sglang serve' is the recommended entrypoint.\n"
    "  Example: sglang serve --model-path <model> [options]\n"
    "  warnings.warn(\n"
)


def main(argv: list[str] | None = None) -> int:
    try:
        version = current_version()
    except UnknownVersion as exc:
        raw(f"tunedash simulated SGLang: {exc}\n")
        return 2
    if version == "0.5.23":
        raw(ENTRYPOINT_WARNING)
    ns = parse(sys.argv[1:] if argv is None else argv, version)
    from app.sim.host_env import default_state_dir

    state_dir = init_state(default_state_dir())
    models = load_models()
    model = models.get(ns.model_path.rstrip("/"))
    if model is None:
        return unknown_model(ns.model_path)
    faults = [f.strip() for f in os.environ.get(FAULT_ENV, "").split(",") if f.strip()]
    config = gpu_state.read_host_config(state_dir)
    total = config.gpus[0].memory_total_mib if config.gpus else 0
    try:
        resolved = resolve(ns, model, total, version)
    except (ValueError, AssertionError) as exc:
        raw(f"Traceback (most recent call last):\n{type(exc).__name__}: {exc}\n")
        return 1
    try:
        gpu_speed = gpu_speed_factors()
    except ValueError as exc:
        raw(f"Traceback (most recent call last):\nValueError: {exc}\n")
        return 1
    for msg in resolved.msgs:
        log(msg)
    log(f"server_args={server_args_repr(resolved.args)}")
    server = SimServer(resolved, model, state_dir, startup_seconds(state_dir), faults, gpu_speed)
    return asyncio.run(server.run())


if __name__ == "__main__":
    sys.exit(main())
