"""A simulated scheduler's startup as SGLang 0.5.23 logs it (app.sim.rank runs it for the 0.5.23 release).

The lines are the format strings of the 0.5.23 source, in its order (the fixture
tests/data/logs/sglang_0523_startup.log is rendered from the same strings):
- distributed/bootstrap.py: `Init parallel begin.`, `Init parallel ends. elapsed=F s`, `Memory baseline taken.
  mem usage=F GB` (again, 0.00, before the draft model loads);
- weight_cache/ipc_loader.py (`--weight-cache-mode client`): the target's weights from the daemon
  (app.sim.ipc_client), or its disk fallback;
- model_executor/model_runner.py: `Load weight begin. avail mem=F GB`, `Load weight end. elapsed=F s, type=ARCH,
  avail mem=F GB, mem usage=F GB.` (the target, then with EAGLE-type speculation the draft model);
- mem_cache/memory_pool.py, kv_cache_configurator.py: `Mamba Cache is allocated. ...` (with speculation also the
  intermediate caches), `KV Cache is allocated. dtype: torch.D, #tokens: N, K size: F GB, V size: F GB`,
  `Memory pool end. avail mem=F GB` (target; then the draft's own KV pool);
- model_runner_components/cuda_graph_setup.py: `Capture target prefill CUDA graph begin. backend=B,
  num_tokens=[...], avail mem=F GB` / `... end. elapsed=F s, mem usage=F GB, avail mem=F GB.`, or when the
  prefill backend resolved to disabled `Disable prefill CUDA graph because cuda_graph_config resolved
  prefill.backend='disabled' ...` (the target's runner, then the draft's); then `Capture target decode|verify
  CUDA graph begin. backend=B, num_tokens_per_req=N, avail mem=F GB` / `... end. bs=[...], elapsed=F s, ...`;
- speculative/eagle_worker_v2.py (rank 0 only): `Capture draft decode CUDA graph begin. backend=B,
  num_tokens_per_req=TOPK, bs=[...], avail mem=F GB` (steps > 1) and `Capture draft extend CUDA graph ...`.
"""

from __future__ import annotations

import time

from app.sim import gpu_state, ipc_client
from app.sim.rank_phases import RankPhases
from app.sim.tracebacks import GIB, capture_oom_traceback

PREFILL_OFF = ("Disable prefill CUDA graph because cuda_graph_config resolved prefill.backend='disabled' (e.g. via "
               "--cuda-graph-backend-prefill=disabled or auto-disable rules).")
DRAFT_KV_SHARE = 0.06  # the draft model's own KV pool, as a share of the target's


def start(rank: RankPhases) -> int:
    """0.5.23's startup lines on one rank; the token capacity."""
    model, phases = rank.model, rank.phases
    rank.say("Init parallel begin.")
    used = rank.init_context()
    rank.say(f"Init parallel ends. elapsed={phases['init']:.2f} s")
    rank.say(f"Memory baseline taken. mem usage={used:.2f} GB")
    weights_mib = model["weights_gib"] * GIB / rank.tp
    draft_mib = float(model.get("draft_weights_gib", 0)) * GIB / rank.tp if rank.spec_graphs else 0.0
    draft_share = 0.06 if draft_mib else 0.0
    cached = rank.args.get("weight_cache_mode") == "client" and ipc_client.load_from_cache(rank, model["architecture"])
    if not cached:
        rank.load_weights(weights_mib, phases["weights"] * (1 - draft_share), model["architecture"], "")
    if draft_mib:
        rank.say("Memory baseline taken. mem usage=0.00 GB")
        rank.load_weights(draft_mib, phases["weights"] * draft_share, model["draft_architecture"], "")
    tokens = memory_pools(rank, weights_mib + draft_mib)
    graphs(rank)
    return tokens


def memory_pools(rank: RankPhases, weights_mib: float) -> int:
    """Mamba state, the target's KV pool, then (speculation) the draft's; the token capacity. Weights mapped
    from the weight cache daemon count as the weights: they are on the GPU already, the daemon's."""
    model = rank.model
    pool_kv_mib, mamba_mib, _ = rank.allocate_pool(weights_mib)
    draft = rank.spec_graphs
    kv_mib = pool_kv_mib / (1 + DRAFT_KV_SHARE) if draft else pool_kv_mib
    tokens = int(kv_mib * 1024 / (model["kv_kib_per_token"] / rank.tp))
    rank.hold_pool(kv_mib, mamba_mib)
    if mamba_mib:
        extra = ""
        if draft:  # spec decoding keeps the intermediate states of the verified steps
            extra = (f"intermediate_ssm_state_cache size: {mamba_mib / GIB * 0.3:.2f}GB "
                     f"intermediate_conv_window_cache size: {mamba_mib / GIB * 0.01:.2f}GB ")
        rank.say(rank.mamba_line(mamba_mib, extra))
    dtype = f"torch.{model['dtype']}"
    pools = [kv_mib, pool_kv_mib - kv_mib] if draft else [kv_mib]
    for i, size in enumerate(pools):
        if i:
            rank.hold_pool(size, 0.0)
        half = size / GIB / 2
        rank.say(f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, K size: {half:.2f} GB, "
                 f"V size: {half:.2f} GB")
        rank.say(f"Memory pool end. avail mem={rank.avail_gb():.2f} GB")
    return tokens


def graphs(rank: RankPhases) -> None:
    """The target's prefill and decode (verify) graphs, then the draft's decode and extend graphs."""
    args, phases, running = rank.args, rank.phases, rank.running
    decode_backend = args["cuda_graph_backend_decode"]
    if running["prefill_graph"]:
        capture(rank, "target prefill", phases["piecewise"], 410,
                f"backend={running['prefill_graph_backend']}, num_tokens={prefill_token_sizes(rank)}, ")
    else:
        rank.say(PREFILL_OFF)
    if running["decode_graph"]:
        name, per_req = ("target verify", args["speculative_num_draft_tokens"]) if rank.spec_graphs \
            else ("target decode", 1)
        capture(rank, name, phases["graph"], 620 + 20 * running["graph_max_bs"] // 8,
                f"backend={decode_backend}, num_tokens_per_req={per_req}, ", end_bs=True)
    if not rank.spec_graphs:
        return
    if not running["prefill_graph"]:
        rank.say(PREFILL_OFF)  # the draft's runner checks the resolved backend too
    if not running["decode_graph"]:  # eagle_worker_v2: no draft graphs with the decode graph disabled
        return
    bs = f"bs={decode_batch_sizes(rank)}, "
    if args["speculative_num_steps"] > 1:
        capture(rank, "draft decode", phases["draft_graph"] / 2, 180,
                f"backend={decode_backend}, num_tokens_per_req={args['speculative_eagle_topk']}, {bs}",
                rank0_only=True)
    capture(rank, "draft extend", phases["draft_graph"] / 2, 120,
            f"backend={decode_backend}, num_tokens_per_req={args['speculative_num_draft_tokens']}, {bs}",
            rank0_only=True)


def decode_batch_sizes(rank: RankPhases) -> list[int]:
    """0.5.23's decode capture sizes (generate_decode_cuda_graph_batch_sizes) up to the graph's max bs."""
    max_bs = int(rank.running["graph_max_bs"])
    if rank.spec_graphs:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [b for b in sizes if b <= max_bs]
    return sizes if max_bs in sizes else [*sizes, max_bs]


def prefill_token_sizes(rank: RankPhases) -> list[int]:
    """0.5.23's prefill capture sizes (generate_prefill_cuda_graph_batch_sizes) up to the prefill max."""
    top = int(rank.running["prefill_graph_max_tokens"])
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, top + 1, 512)]
    return [n for n in sizes if n <= top]


def capture(rank: RankPhases, name: str, seconds: float, mib: int, detail: str, end_bs: bool = False,
            rank0_only: bool = False) -> None:
    """One capture: `Capture {role} {phase} CUDA graph begin. {detail}avail mem=...` / `... end. ...`."""
    quiet = rank0_only and rank.tp_rank != 0

    def say(msg: str) -> None:
        if not quiet:
            rank.say(msg)

    before = rank.avail_gb()
    t0 = time.time()
    say(f"Capture {name} CUDA graph begin. {detail}avail mem={before:.2f} GB")
    time.sleep(seconds)
    if end_bs and "oom_capture" in rank.faults:
        rank.fail(capture_oom_traceback(rank.prefix, gpu_state.free_mib(rank.state, rank.gpu), rank.total_mib,
                                        new_hints=True))
    try:
        rank.hold(mib, "cuda_graph")
    except gpu_state.OutOfMemory:
        rank.fail(capture_oom_traceback(rank.prefix, gpu_state.free_mib(rank.state, rank.gpu), rank.total_mib,
                                        new_hints=True))
    after = rank.avail_gb()
    bs = f"bs={decode_batch_sizes(rank)}, " if end_bs else ""
    say(f"Capture {name} CUDA graph end. {bs}elapsed={time.time() - t0:.2f} s, mem usage={before - after:.2f} GB, "
        f"avail mem={after:.2f} GB.")
