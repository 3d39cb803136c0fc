"""The catalog's "keeps the weights" / "changes the cache key" marks come from the servers' own key dataclasses:
SGLang 0.5.23's CacheConfig and vLLM 0.32's WeightCacheKey, read from the real packages in a subprocess; every flag
the tables name exists in the real parser; the simulator builds its key with the same fields.

Skipped when a venv is missing, except under CI (the environment variable CI set), where that fails.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from app.core.flags.weight_cache import SGLANG_CACHE_KEY, VLLM_CACHE_KEY, weights_effect
from app.sim.versions import flag_table
from app.sim.weight_cache import CACHE_FIELDS
from tests.helpers import REPO
from tests.integration.test_sglang_real import sglang_python

pytestmark = pytest.mark.slow

SGLANG_FIELDS = ("import json; from sglang.srt.weight_cache.protocol import CacheConfig; "
                 "print(json.dumps(list(CacheConfig.__struct_fields__)))")
VLLM_FIELDS = ("import dataclasses, json; from vllm.model_executor.model_loader.weight_cache.protocol import "
               "WeightCacheKey; print(json.dumps([f.name for f in dataclasses.fields(WeightCacheKey)]))")


def vllm_python() -> str:
    done = subprocess.run([str(REPO / "scripts" / "vllm-cpu-env")], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 or "python=" not in done.stdout:
        why = f"the vLLM CPU environment is absent: {done.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return done.stdout.split("python=", 1)[1].split()[0]


def real_fields(python: str, code: str) -> list[str]:
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, cwd="/",
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    fields: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return fields


def test_the_sglang_key_table_is_the_real_cache_config() -> None:
    fields = real_fields(sglang_python("0.5.23"), SGLANG_FIELDS)
    assert list(SGLANG_CACHE_KEY) == fields
    assert list(CACHE_FIELDS) == fields  # the simulated daemon fingerprints with the same fields
    real_names = {opt.lstrip("-") for row in flag_table("0.5.23").flags for opt in row.option_strings}
    named = {flag for flags in SGLANG_CACHE_KEY.values() for flag in flags}
    assert named - real_names == set()


@pytest.mark.vllm
def test_the_vllm_key_table_is_the_real_weight_cache_key() -> None:
    assert list(VLLM_CACHE_KEY) == real_fields(vllm_python(), VLLM_FIELDS)


def test_tuning_flags_keep_the_weights_and_parallel_flags_change_the_key() -> None:
    for flag in ("speculative-num-steps", "cuda-graph-backend-prefill", "disable-overlap-schedule",
                 "enable-single-batch-overlap", "mem-fraction-static", "max-running-requests", "port"):
        assert weights_effect("sglang", flag) == "keeps the weights"
    assert weights_effect("sglang", "tp-size") == "changes the cache key (tp_size, tp_rank)"
    assert weights_effect("sglang", "dtype") == "changes the cache key (dtype)"
    assert weights_effect("vllm", "tensor-parallel-size") == "changes the cache key (tp_size, tp_rank)"
