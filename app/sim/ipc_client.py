"""A simulated 0.5.23 scheduler's weights from the weight cache daemon (`--weight-cache-mode client`).

It plays weight_cache/ipc_loader.py IpcModelLoader in client mode (docs/servers.md#the-weight-cache-daemon):
- no socket at the GPU's path: `[IpcModelLoader] Daemon socket not found at P.` and `[IpcModelLoader] Weight
  cache not available or config mismatch, falling back to disk load`: the caller loads from disk;
- a socket that refuses: the real RuntimeError (the scheduler fails);
- the daemon answers "mismatch": `RuntimeError: [IpcModelLoader] Daemon config mismatch!` with both configs
  (0.5.23 raises here: no disk load on a GPU holding another config's weights);
- a match: the `Requesting weights`, `Fetched N tensors`, `Zero-copy: mapped`, `Started daemon-liveness
  watchdog for pid=P` and `Loaded model via IPC (mode=client), total=...` lines in about the `ipc_weights`
  phase, and a watchdog thread that polls the daemon's pid every 5 s and, once it is gone, logs the real
  critical line and SIGKILLs this scheduler (the main process's SubprocessWatchdog then ends the server).
The scheduler holds no weight memory then: the weights stay the daemon's on the GPU.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import threading
import time

from app.sim import gpu_state, weight_cache
from app.sim.rank_phases import RankPhases

LIVENESS_POLL_S = 5.0  # ipc_loader._DAEMON_LIVENESS_POLL_INTERVAL


def _gpu(rank: RankPhases) -> gpu_state.SimGpu:
    return next(g for g in gpu_state.read_host_config(rank.state).gpus if g.index == rank.gpu)


def fail_runtime(rank: RankPhases, message: str) -> None:
    from app.sim.simlog import stamp

    rank.fail([f"[{stamp()}{rank.prefix}] Scheduler hit an exception: Traceback (most recent call last):\n",
               '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/weight_cache/ipc_loader.py", line 108, '
               "in load_model\n",
               f"RuntimeError: {message}\n"])


def load_from_cache(rank: RankPhases, architecture: str) -> bool:
    """The target's weights from the daemon: True when loaded, False when the caller falls back to disk."""
    gpu = _gpu(rank)
    path = rank.args.get("weight_cache_socket") or weight_cache.socket_path(gpu.uuid)
    start_avail = rank.avail_gb()
    rank.say(f"Load weight begin. avail mem={start_avail:.2f} GB")
    t0 = time.perf_counter()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        rank.say(f"[IpcModelLoader] Daemon socket not found at {path}.")
        rank.say("[IpcModelLoader] Weight cache not available or config mismatch, falling back to disk load")
        return False
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        fail_runtime(rank, f"[IpcModelLoader] Refusing to connect: {path} is not a socket owned by this user.")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    try:
        sock.connect(path)
    except FileNotFoundError:
        sock.close()
        return False
    except ConnectionRefusedError:
        sock.close()
        fail_runtime(rank, f"[IpcModelLoader] Daemon socket exists at {path} but refused the connection. The daemon "
                           "may have crashed after creating the socket. Check daemon logs.")
    config = weight_cache.cache_config(rank.args, rank.model, rank.tp_rank, gpu)
    rank.say(f"[IpcModelLoader] Requesting weights from daemon at {path} with config: model={config['model_path']}, "
             f"arch={config['model_arch']}, tp={config['tp_size']}/{config['tp_rank']}, "
             f"quant={config['quant_method']}, dtype={config['dtype']}")
    try:
        weight_cache.send_msg(sock, {"type": "fetch_state", "config": config})
        result = weight_cache.recv_msg(sock)
    except (OSError, ValueError) as exc:
        fail_runtime(rank, f"[IpcModelLoader] Error communicating with daemon at {path}: {exc}")
    finally:
        sock.close()
    if result.get("status") != "ok":
        fail_runtime(rank, f"[IpcModelLoader] Daemon config mismatch!\n  Engine config: {config}\n  Daemon config: "
                           f"{result.get('daemon_config', {})}")
    seconds = rank.phases.get("ipc_weights", 0.0)
    time.sleep(seconds * 0.2)
    tensors = int(result.get("entries", 0))
    rank.say(f"[IpcModelLoader] Fetched {tensors} tensors from daemon (transport=torch_ipc) in "
             f"{time.perf_counter() - t0:.2f}s")
    time.sleep(seconds * 0.8)
    rank.say(f"[IpcModelLoader] Zero-copy: mapped {tensors} tensors (0 new post-quant), "
             f"time={seconds * 0.8:.3f}s")
    pid = int(result.get("pid") or 0)
    watch_daemon(rank, pid)
    rank.say(f"[IpcModelLoader] Loaded model via IPC (mode=client), total={time.perf_counter() - t0:.2f}s")
    end_avail = rank.avail_gb()
    rank.say(f"Load weight end. elapsed={time.perf_counter() - t0:.2f} s, type={architecture}, "
             f"avail mem={end_avail:.2f} GB, mem usage={start_avail - end_avail:.2f} GB.")
    return True


def watch_daemon(rank: RankPhases, pid: int) -> None:
    """IpcModelLoader._start_daemon_liveness_watchdog."""
    if pid <= 0:
        rank.say("[IpcModelLoader] Daemon did not report a PID; skipping the daemon-liveness watchdog. A daemon "
                 "crash will not be detected.")
        return

    def watch() -> None:
        while True:
            time.sleep(LIVENESS_POLL_S)
            if not weight_cache.pid_alive(pid):
                rank.say(f"[IpcModelLoader] Weight cache daemon (pid={pid}) died while this engine holds its "
                         "weights via CUDA IPC. The mapped weight pointers are now dangling; continuing would read "
                         "freed GPU memory. Terminating this process.")
                os.kill(os.getpid(), signal.SIGKILL)
                return

    threading.Thread(target=watch, name="weight-cache-daemon-watchdog", daemon=True).start()
    rank.say(f"[IpcModelLoader] Started daemon-liveness watchdog for pid={pid}")

