"""Which launch flags change the weight cache's key and which keep the weights (pure data and lookups).

The key is the server's own fingerprint of the cached weights (docs/servers.md#the-weight-cache-daemon):
SGLang 0.5.23's `CacheConfig` (sglang/srt/weight_cache/protocol.py) and vLLM 0.32's `WeightCacheKey`
(vllm/model_executor/model_loader/weight_cache/protocol.py). Each table maps every field of that dataclass, in its
order, to the launch flags that set it; a field no flag sets (the torch or vLLM version) maps to (). A flag in no
field's tuple keeps the weights: changing it relaunches only the engine, the daemon keeps serving. The profile's
`model` is the model-path flag. tests/unit/test_weight_cache_key.py holds the tables to the real dataclasses'
field lists and every flag named here to the real parser.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.core.data import FlagValue

# CacheConfig's fields (0.5.23) -> the flags (without dashes) that set them.
SGLANG_CACHE_KEY: dict[str, tuple[str, ...]] = {
    "model_path": ("model-path",),
    "model_arch": ("model-path", "json-model-override-args"),
    "tp_size": ("tp-size",),
    "tp_rank": ("tp-size", "nnodes", "node-rank"),
    "pp_size": ("pp-size",),
    "pp_rank": ("pp-size", "nnodes", "node-rank"),
    "dp_size": ("dp-size",),
    "ep_size": ("ep-size",),
    "moe_dp_size": ("moe-dp-size",),
    "moe_dp_rank": ("moe-dp-size",),
    "moe_ep_rank": ("ep-size",),
    "attn_dp_size": ("attn-dp-size", "enable-dp-attention"),
    "enable_dp_lm_head": ("enable-dp-lm-head",),
    "attn_cp_size": ("attn-cp-size",),
    "moe_dense_tp_size": ("moe-dense-tp-size",),
    "moe_a2a_backend": ("moe-a2a-backend",),
    "quant_method": ("quantization",),
    "quant_config_hash": ("quantization", "quantization-param-path"),
    "dtype": ("dtype",),
    "revision": ("revision",),
    "device_capability": ("base-gpu-id", "gpu-id-step"),  # the GPU the rank lands on
    "torch_version": (),  # the server's environment, no flag
}

# WeightCacheKey's fields (vLLM 0.32) -> the flags that set them.
VLLM_CACHE_KEY: dict[str, tuple[str, ...]] = {
    "checkpoint": ("model",),
    "model_arch": ("model", "hf-overrides"),
    "tp_size": ("tensor-parallel-size",),
    "tp_rank": ("tensor-parallel-size",),
    "dtype": ("dtype",),
    "quantization": ("quantization",),
    "quant_config_hash": ("quantization", "hf-overrides"),
    "revision": ("revision",),
    "vllm_version": (),
    "pp_size": ("pipeline-parallel-size",),
    "pp_rank": ("pipeline-parallel-size",),
    "is_draft": ("speculative-config",),
    "dp_size": ("data-parallel-size",),
    "dp_rank": ("data-parallel-size",),
}

KEEPS = "keeps the weights"


def key_table(backend: str) -> dict[str, tuple[str, ...]]:
    """The backend's key table; {} for a backend without a weight cache (custom)."""
    return SGLANG_CACHE_KEY if backend == "sglang" else VLLM_CACHE_KEY if backend == "vllm" else {}


def key_fields(backend: str, flag: str) -> tuple[str, ...]:
    """The key's fields `flag` (a catalog name, no dashes) sets, in the dataclass's order; () when it keeps them."""
    return tuple(name for name, flags in key_table(backend).items() if flag in flags)


def weights_effect(backend: str, flag: str) -> str:
    """What changing `flag` does to a warm relaunch, for people: "changes the cache key (dtype)" or KEEPS."""
    fields = key_fields(backend, flag)
    return f"changes the cache key ({', '.join(fields)})" if fields else KEEPS


def changed_key_fields(backend: str, old: Mapping[str, FlagValue], new: Mapping[str, FlagValue]) -> tuple[str, ...]:
    """The key fields two flag sets (the profile's `model` included under the model flag) differ in."""
    flags = {name for name in set(old) | set(new) if old.get(name) != new.get(name)}
    return tuple(field for field, setters in key_table(backend).items() if flags.intersection(setters))
