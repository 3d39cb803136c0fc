"""The simulated SGLang 0.5.23 weight cache daemon: `python -m app.sim.weight_cache <server args>`.

It plays `python -m sglang.srt.weight_cache.daemon` of the 0.5.23 wheel (weight_cache/daemon.py, protocol.py;
docs/servers.md#the-weight-cache-daemon):
- the launcher (no --gpu-id/--tp-rank) takes the daemon's own flags (--gpu-id, --tp-rank, --pp-rank,
  --dist-init-method, --timeout, --force: parse_known_args, as the real `__main__`) and the server's flags (the
  release's real parser), refuses a live daemon's files (`cleanup_stale_daemon_files`), starts one daemon per
  local TP rank, logs `Launched weight cache daemon gpu=G pp_rank=0 tp_rank=R pid=P`, polls each ready file every
  2 s (the real `check_interval`) and logs `Weight cache daemon pp_rank=0 tp_rank=R is ready`, then `All N
  weight cache daemons on node 0 are ready (...)`; it then watches its daemons and, when one exits, terminates
  the rest and fails with the real RuntimeError;
- a daemon (--gpu-id/--tp-rank given: the real single-daemon path) dies with its parent (PR_SET_PDEATHSIG,
  the real `kill_itself_when_parent_died`), logs in its own format (`%(asctime)s [Daemon gpu=G tp_rank=R]
  %(levelname)s %(message)s`), holds its CUDA context and the rank's weights in the simulated GPU state for the
  weights phase, then binds its socket, writes the ready file (`pid=P` and `config={...}`) and serves:
  `fetch_state` with a CacheConfig that differs logs `Config mismatch: {field: (daemon, engine)}` and answers
  "mismatch"; a match logs `Serving N tensors via torch_ipc transport` and answers with its pid. SIGTERM:
  `Received signal 15, shutting down`, both files removed, `Shutdown complete`.

Paths: SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE / SGLANG_WEIGHT_CACHE_READY_TEMPLATE as in the real environ.py (they
must keep `{device_uuid}`); unset, the simulated host's own /tmp (`/tmp/tunedash-sim-<hash of the state folder>/
sglang_weight_cache_{uuid}.sock`, short enough for a socket path) so that simulated hosts side by side never meet.
The wire format is the real one's framing (a 4-byte length) with JSON instead of pickle.
The client's side is app.sim.ipc_client.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from app.sim import gpu_state
from app.sim.placement import InvalidDeviceOrdinal, rank_gpus
from app.sim.rank_phases import CONTEXT_MIB, GIB
from app.sim.simlog import log, raw

SOCKET_TEMPLATE_ENV = "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"
READY_TEMPLATE_ENV = "SGLANG_WEIGHT_CACHE_READY_TEMPLATE"
CHECK_INTERVAL_S = 2.0  # launch_weight_cache_daemons' poll of the ready files
TORCH_VERSION = "2.9.1+cu129"  # the torch of the simulated host (CacheConfig.torch_version)
# CacheConfig's fields in the 0.5.23 source, in order (tests hold this to the real dataclass).
CACHE_FIELDS = (
    "model_path", "model_arch", "tp_size", "tp_rank", "pp_size", "pp_rank", "dp_size", "ep_size", "moe_dp_size",
    "moe_dp_rank", "moe_ep_rank", "attn_dp_size", "enable_dp_lm_head", "attn_cp_size", "moe_dense_tp_size",
    "moe_a2a_backend", "quant_method", "quant_config_hash", "dtype", "revision", "device_capability",
    "torch_version",
)
DAEMON_PROCESS_NAME = "python3"  # a multiprocessing spawn child: nvidia-smi shows the interpreter


def _template(env: str, default_name: str) -> str:
    template = os.environ.get(env)
    if template is None:
        template = str(sim_tmp() / default_name)
    if "{device_uuid}" not in template:
        raise ValueError(
            f"{env}={template!r} must contain '{{device_uuid}}': each physical GPU needs its own path, and a "
            f"GPU-independent one would point every caller at a single daemon.")
    return template


def sim_tmp() -> Path:
    """The simulated host's /tmp for the daemon's files: short (a socket path has 108 bytes), one per state folder."""
    import hashlib

    state = str(Path(os.environ.get("TUNEDASH_SIM_STATE") or gpu_state_dir()).resolve())
    tmp = Path("/tmp") / f"tunedash-sim-{hashlib.sha256(state.encode()).hexdigest()[:10]}"
    tmp.mkdir(mode=0o700, exist_ok=True)
    return tmp


def gpu_state_dir() -> Path:
    from app.sim.host_env import default_state_dir

    return default_state_dir()


def socket_path(device_uuid: str) -> str:
    """The daemon's Unix socket for one GPU (protocol.get_socket_path)."""
    return _template(SOCKET_TEMPLATE_ENV, "sglang_weight_cache_{device_uuid}.sock").format(device_uuid=device_uuid)


def ready_path(device_uuid: str) -> str:
    """The daemon's ready file for one GPU (protocol.get_ready_path)."""
    return _template(READY_TEMPLATE_ENV, "sglang_weight_cache_{device_uuid}.ready").format(device_uuid=device_uuid)


def read_ready_pid(path: str) -> int | None:
    """The `pid=` line of a ready file; None when unreadable (protocol._read_ready_pid)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("pid="):
                    return int(line.strip().split("=", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def pid_alive(pid: int) -> bool:
    """protocol._is_pid_alive (signal 0), except that a zombie counts as dead: on a host whose PID 1 reaps late
    (containers) a SIGKILLed daemon stays a zombie for seconds, holding nothing, and the real check would call
    its stale files live."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def cache_config(args: dict[str, Any], model: dict[str, Any], tp_rank: int, gpu: gpu_state.SimGpu) -> dict[str, Any]:
    """The CacheConfig a daemon and an engine rank build from the same server args (protocol.CacheConfig)."""
    dtype = args.get("dtype") or "auto"
    quant = args.get("quantization") or ""
    quant_hash = ""
    if quant:
        import hashlib

        quant_hash = hashlib.sha256(json.dumps({"quant_method": quant}, sort_keys=True).encode()).hexdigest()
    values: dict[str, Any] = {
        "model_path": args["model_path"],
        "model_arch": model["architecture"],
        "tp_size": int(args["tp_size"]),
        "tp_rank": tp_rank,
        "pp_size": int(args.get("pp_size") or 1),
        "pp_rank": 0,
        "dp_size": int(args.get("dp_size") or 1),
        "ep_size": int(args.get("ep_size") or 1),
        "moe_dp_size": int(args.get("moe_dp_size") or 1),
        "moe_dp_rank": 0,
        "moe_ep_rank": 0,
        "attn_dp_size": int(args.get("attn_dp_size") or 1),
        "enable_dp_lm_head": bool(args.get("enable_dp_lm_head")),
        "attn_cp_size": int(args.get("attn_cp_size") or 1),
        "moe_dense_tp_size": args.get("moe_dense_tp_size"),
        "moe_a2a_backend": str(args.get("moe_a2a_backend") or "none"),
        "quant_method": quant,
        "quant_config_hash": quant_hash,
        "dtype": f"torch.{model['dtype'] if dtype == 'auto' else dtype}",
        "revision": args.get("revision") or "",
        "device_capability": gpu.compute_cap,
        "torch_version": TORCH_VERSION,
    }
    return {name: values[name] for name in CACHE_FIELDS}


def send_msg(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def recv_msg(sock: socket.socket, limit: int = 1 << 20) -> Any:
    header = _recv_exact(sock, 4)
    if header is None:
        raise ConnectionError("Connection closed while reading message header")
    (length,) = struct.unpack("!I", header)
    if length > limit:
        raise ValueError(f"Message size {length} exceeds {limit} byte cap")
    body = _recv_exact(sock, length)
    if body is None:
        raise ConnectionError("Connection closed while reading message body")
    return json.loads(body)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf.extend(chunk)
    return bytes(buf)


def cleanup_stale_files(device_uuid: str, force: bool) -> None:
    """protocol.cleanup_stale_daemon_files: refuse a live daemon's files (or SIGKILL it with --force)."""
    ready, sock = ready_path(device_uuid), socket_path(device_uuid)
    if not os.path.exists(ready) and not os.path.exists(sock):
        return
    pid = read_ready_pid(ready) if os.path.exists(ready) else None
    if pid is not None and pid_alive(pid):
        if not force:
            raise RuntimeError(
                f"Weight cache daemon for GPU {device_uuid} is already running (pid={pid}, ready={ready}). Stop the "
                f"existing daemon before launching a new one, or pass force=True (--force) to kill it and take over.")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for path in (ready, sock):
        if os.path.exists(path):
            os.unlink(path)
            log(f"Removed stale daemon file: {path}")


# ---------------------------------------------------------------------------------------------- one daemon


class Daemon:
    """One rank's daemon: load, hold, serve (weight_cache/daemon.py WeightCacheDaemon)."""

    def __init__(self, args: dict[str, Any], model: dict[str, Any], gpu: gpu_state.SimGpu, tp_rank: int,
                 state_dir: str, weights_s: float) -> None:
        self.args, self.model, self.gpu, self.tp_rank = args, model, gpu, tp_rank
        self.state_dir, self.weights_s = state_dir, weights_s
        self.config = cache_config(args, model, tp_rank, gpu)
        self.socket_path = socket_path(gpu.uuid)
        self.ready_path = ready_path(gpu.uuid)
        self.tensors = int(model.get("tensors", 1000)) // max(int(args["tp_size"]), 1) + 38
        self.running = False

    def say(self, msg: str, level: str = "INFO") -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now * 1000) % 1000:03d}"
        try:
            os.write(2, f"{stamp} [Daemon gpu={self.gpu.index} tp_rank={self.tp_rank}] {level} {msg}\n".encode())
        except OSError:
            pass

    def hold(self, mib: float, phase: str) -> None:
        gpu_state.allocate(self.state_dir, self.gpu.index, int(mib), DAEMON_PROCESS_NAME, phase)

    def load(self) -> None:
        tag = f"[WeightCacheDaemon gpu={self.gpu.index} tp_rank={self.tp_rank}]"
        self.hold(CONTEXT_MIB, "context")
        self.say(f"{tag} Distributed backend initialized (tp_size={self.args['tp_size']}, pp_size=1, "
                 f"world_size={self.args['tp_size']})")
        self.say(f"{tag} Loading model from disk: {self.args['model_path']}")
        t0 = time.perf_counter()
        weights_mib = float(self.model["weights_gib"]) * GIB / int(self.args["tp_size"])
        chunks = 4
        for _ in range(chunks):
            time.sleep(self.weights_s / chunks)
            self.hold(weights_mib / chunks, "weights")
        self.say(f"{tag} Model loaded from disk in {time.perf_counter() - t0:.2f}s")
        self.say(f"[WeightCacheDaemon gpu={self.gpu.index}] Exported {self.tensors} tensors (0 non-persistent "
                 f"buffers), transport=torch_ipc, metadata size ~{self.tensors * 0.0004:.1f} MB")
        self.say(f"{tag} Exported {self.tensors} tensors as IPC handles.")

    def serve(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.socket_path)
        finally:
            os.umask(old)
        sock.listen(8)
        sock.settimeout(1.0)
        with open(self.ready_path, "w") as fh:
            fh.write(f"pid={os.getpid()}\n")
            fh.write(f"config={self.config}\n")
        self.say(f"[WeightCacheDaemon gpu={self.gpu.index}] Listening on {self.socket_path}")
        self.running = True

        def on_signal(signum: int, frame: object) -> None:
            self.say(f"[WeightCacheDaemon gpu={self.gpu.index}] Received signal {signum}, shutting down")
            self.running = False

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            while self.running:
                try:
                    conn, _ = sock.accept()
                except TimeoutError:
                    continue
                except InterruptedError:
                    continue
                conn.settimeout(30)
                try:
                    self.handle(conn)
                except (OSError, ValueError) as exc:
                    self.say(f"[WeightCacheDaemon gpu={self.gpu.index}] Error handling connection: {exc}", "ERROR")
                finally:
                    conn.close()
        finally:
            sock.close()
            for path in (self.socket_path, self.ready_path):
                if os.path.exists(path):
                    os.unlink(path)
            self.say(f"[WeightCacheDaemon gpu={self.gpu.index}] Shutdown complete")

    def handle(self, conn: socket.socket) -> None:
        req = recv_msg(conn)
        kind = req.get("type") if isinstance(req, dict) else None
        if kind == "query_config" or kind == "ping":
            send_msg(conn, {"status": "ok", "config": self.config})
        elif kind == "fetch_state":
            engine = req.get("config") if isinstance(req.get("config"), dict) else {}
            mismatches = {k: (v, engine.get(k)) for k, v in self.config.items() if engine.get(k) != v}
            if mismatches:
                self.say(f"[WeightCacheDaemon gpu={self.gpu.index}] Config mismatch: {mismatches}", "WARNING")
                send_msg(conn, {"status": "mismatch", "daemon_config": self.config})
                return
            self.say(f"[WeightCacheDaemon gpu={self.gpu.index}] Serving {self.tensors} tensors via torch_ipc "
                     "transport")
            send_msg(conn, {"status": "ok", "config": self.config, "entries": self.tensors, "pid": os.getpid(),
                            "preloaded_weights_bytes": int(float(self.model["weights_gib"]) * 2**30
                                                           / int(self.args["tp_size"]))})
        else:
            send_msg(conn, {"status": "error", "message": f"Unknown request type: {kind}"})


def die_with_parent() -> None:
    """utils.kill_itself_when_parent_died: PR_SET_PDEATHSIG = SIGKILL."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def run_daemon(args: dict[str, Any], model: dict[str, Any], gpu: gpu_state.SimGpu, tp_rank: int,
               weights_s: float) -> int:
    die_with_parent()
    daemon = Daemon(args, model, gpu, tp_rank, str(state_dir()), weights_s)
    daemon.load()
    daemon.serve()
    return 0


# ---------------------------------------------------------------------------------------------- the launcher


def state_dir() -> Path:
    from app.sim.host_env import init_state

    return init_state(gpu_state_dir())


def worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--gpu-id", type=int, default=None)
    parser.add_argument("--tp-rank", type=int, default=None)
    parser.add_argument("--pp-rank", type=int, default=0)
    parser.add_argument("--dist-init-method", default=None)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--force", action="store_true")
    return parser


def fail(exc: BaseException) -> int:
    raw("Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/weight_cache/daemon.py", line 921, in '
        "<module>\n"
        f"{type(exc).__name__}: {exc}\n")
    return 1


def launch(server_argv: list[str], args: dict[str, Any], gpus: list[gpu_state.SimGpu], timeout: int,
           force: bool, dist_init_method: str | None) -> int:
    """launch_weight_cache_daemons: one daemon per local TP rank, ready files awaited, then watched."""
    tp, base = int(args["tp_size"]), int(args.get("base_gpu_id") or 0)
    try:
        phys = rank_gpus(tp, base, len(gpus))  # CUDA_VISIBLE_DEVICES as the server's ranks see it
    except InvalidDeviceOrdinal:
        return fail(RuntimeError("CUDA error: invalid device ordinal"))
    if dist_init_method is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            dist_init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    try:
        for rank in range(tp):
            cleanup_stale_files(gpus[phys[rank]].uuid, force)
    except (RuntimeError, ValueError) as exc:
        return fail(exc)
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(tp):
        gpu = phys[rank]
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.sim.weight_cache", "--gpu-id", str(gpu), "--tp-rank", str(rank),
             "--pp-rank", "0", "--dist-init-method", dist_init_method, *server_argv], stdin=subprocess.DEVNULL)
        procs.append(proc)
        log(f"Launched weight cache daemon gpu={gpu} pp_rank=0 tp_rank={rank} pid={proc.pid}")

    def stop_all() -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.time()
    for rank in range(tp):
        path = ready_path(gpus[phys[rank]].uuid)
        while not os.path.exists(path):
            time.sleep(CHECK_INTERVAL_S)
            if time.time() - start > timeout:
                msg = f"Weight cache daemon pp_rank=0 tp_rank={rank} did not become ready within {timeout}s"
                log(msg)
                for p in procs:
                    p.terminate()
                return fail(TimeoutError(msg))
            dead = next((p for p in procs if p.poll() is not None), None)
            if dead is not None:
                log(f"Weight cache daemon exited prematurely with code {dead.returncode}")
                stop_all()
                return fail(RuntimeError(f"Weight cache daemon exited prematurely with code {dead.returncode}"))
        log(f"Weight cache daemon pp_rank=0 tp_rank={rank} is ready")
    log(f"All {tp} weight cache daemons on node 0 are ready (pp_ranks=0..0, tp_ranks=0..{tp - 1}, "
        f"dist_init_method={dist_init_method})")
    exited: subprocess.Popen[bytes] | None = None
    try:
        while exited is None:
            exited = next((p for p in procs if p.poll() is not None), None)
            if exited is None:
                time.sleep(1)
    except KeyboardInterrupt:
        log("Received KeyboardInterrupt, shutting down daemons")
    finally:
        stop_all()
        log("All weight cache daemons have been terminated")
    if exited is not None:
        return fail(RuntimeError(f"Weight cache daemon (pid={exited.pid}) exited with code {exited.returncode}; "
                                 "terminated the remaining daemons."))
    return 0


def weights_seconds(args: dict[str, Any], folder: Path) -> float:
    """The daemon's disk load: the weights phase the server itself would take (app.sim.sglang's phases)."""
    from app.sim.sglang import phase_seconds, startup_seconds

    return phase_seconds(startup_seconds(folder))["weights"]


def main(argv: list[str] | None = None) -> int:
    from app.sim.server_args import load_models, parse, resolve
    from app.sim.versions import UnknownVersion, current_version

    argv = sys.argv[1:] if argv is None else argv
    worker, server_argv = worker_parser().parse_known_args(argv)
    try:
        version = current_version()
    except UnknownVersion as exc:
        raw(f"tunedash simulated SGLang: {exc}\n")
        return 2
    if version != "0.5.23":
        raw(f"/usr/bin/python3: No module named sglang.srt.weight_cache (SGLang {version} has no weight cache)\n")
        return 1
    ns = parse(server_argv, version)
    folder = state_dir()
    model = load_models().get(ns.model_path.rstrip("/"))
    if model is None:
        from app.sim.sglang import unknown_model

        return unknown_model(ns.model_path)
    config = gpu_state.read_host_config(folder)
    total = config.gpus[0].memory_total_mib if config.gpus else 0
    try:
        resolved = resolve(ns, model, total, version)
    except (ValueError, AssertionError) as exc:
        return fail(exc)
    args = resolved.args
    gpus = list(config.gpus)
    if worker.gpu_id is not None or worker.tp_rank is not None:
        gpu_id = worker.gpu_id if worker.gpu_id is not None else worker.tp_rank
        tp_rank = worker.tp_rank if worker.tp_rank is not None else worker.gpu_id
        if not 0 <= gpu_id < len(gpus):
            return fail(RuntimeError("CUDA error: invalid device ordinal"))
        try:
            cleanup_stale_files(gpus[gpu_id].uuid, worker.force)
        except (RuntimeError, ValueError) as exc:
            return fail(exc)
        return run_daemon(args, model, gpus[gpu_id], tp_rank, weights_seconds(args, folder))
    return launch(server_argv, args, gpus, worker.timeout, worker.force, worker.dist_init_method)


if __name__ == "__main__":
    sys.exit(main())
