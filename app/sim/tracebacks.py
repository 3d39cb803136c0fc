"""The tracebacks a simulated scheduler prints when it fails: a corrupt shard, CUDA OOM loading or capturing."""

from __future__ import annotations

from app.sim import gpu_state
from app.sim.simlog import stamp

GIB = 1024.0


def _ts() -> str:
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


def capture_oom_traceback(prefix: str, free_mib: int, total_mib: int, new_hints: bool = False) -> list[str]:
    """A CUDA OOM while capturing the decode graph; new_hints: 0.5.23's file and list of solutions."""
    want = 1.53
    oom = (
        f"CUDA out of memory. Tried to allocate {want:.2f} GiB. GPU 0 has a total capacity of "
        f"{total_mib / GIB:.2f} GiB of which {min(free_mib, 300):.2f} MiB is free."
    )
    runner = "model_executor/runner/decode_cuda_graph_runner.py" if new_hints else "model_executor/cuda_graph_runner.py"
    hints = [
        "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n",
        "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge performance "
        "loss)\n",
        "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n",
    ] if new_hints else [
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n",
        "3. disable torch compile by not using --enable-torch-compile\n",
        "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n",
    ]
    return [
        f"[{_ts()}{prefix}] Scheduler hit an exception: Traceback (most recent call last):\n",
        f'  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/{runner}", '
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
        *hints,
    ]
