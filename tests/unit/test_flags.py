"""Flag catalogs: coverage of the research, lookups, typo hints, value checks, argv rendering."""

from __future__ import annotations

import pytest

from app.core.flags.values import (
    FlagError,
    catalog,
    check_value,
    closest_flag,
    lookup_flag,
    parse_value,
    render_flag,
)


def words(text: str) -> list[str]:
    return text.split()


# Every flag the research notes name for SGLang and vLLM (the catalog's sources, docs/servers.md).
SGLANG_RESEARCH = words("""
model-path host port tp-size mem-fraction-static context-length load-format speculative-algorithm
speculative-draft-model-path speculative-num-steps speculative-eagle-topk speculative-num-draft-tokens
disable-overlap-schedule enable-single-batch-overlap enable-two-batch-overlap enable-piecewise-cuda-graph
disable-piecewise-cuda-graph enforce-piecewise-cuda-graph piecewise-cuda-graph-max-tokens
piecewise-cuda-graph-tokens piecewise-cuda-graph-compiler language-only cuda-graph-max-bs cuda-graph-bs
disable-cuda-graph enable-torch-compile torch-compile-max-bs enable-flashinfer-allreduce-fusion
enforce-disable-flashinfer-allreduce-fusion flashinfer-allreduce-fusion-backend enable-nccl-nvls
enable-symm-mem max-mamba-cache-size mamba-ssm-dtype mamba-full-memory-ratio mamba-scheduler-strategy
mamba-radix-cache-strategy mamba-track-interval mamba-backend enable-metrics
enable-metrics-for-all-schedulers decode-log-interval skip-server-warmup log-level log-level-http
watchdog-timeout chunked-prefill-size max-running-requests attention-backend kv-cache-dtype
disable-radix-cache enable-dp-attention dp-size config cuda-graph-config cuda-graph-backend-decode
cuda-graph-backend-prefill cuda-graph-max-bs-decode cuda-graph-max-bs-prefill cuda-graph-bs-decode
cuda-graph-bs-prefill disable-prefill-cuda-graph disable-decode-cuda-graph debug-cuda-graph
""")
VLLM_RESEARCH = words("""
model host port speculative-config spec-method spec-model spec-tokens compilation-config optimization-level
performance-mode cudagraph-capture-sizes max-cudagraph-capture-size enforce-eager gpu-memory-utilization
max-model-len tensor-parallel-size max-num-seqs max-num-batched-tokens enable-prefix-caching load-format
disable-log-stats shutdown-timeout async-scheduling dtype seed served-model-name swap-space
show-hidden-metrics-for-version
""")


@pytest.mark.parametrize(("backend", "names"), [("sglang", SGLANG_RESEARCH), ("vllm", VLLM_RESEARCH)])
def test_catalog_covers_every_researched_flag(backend: str, names: list[str]) -> None:
    missing = [name for name in names if name not in catalog(backend)]
    assert missing == []


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_catalog_rows_are_well_formed(backend: str) -> None:
    for name, spec in catalog(backend).items():
        assert spec.name == name and not name.startswith("-")
        assert spec.help and "\n" not in spec.help, name
        if spec.kind == "choice":
            assert spec.choices, name
        if spec.default is not None and spec.kind != "choice":
            assert check_value(spec, spec.default) == spec.default, name
        assert all(isinstance(v, str) for v in spec.versions)
        for alias in spec.aliases:
            assert lookup_flag(backend, alias) is spec


def test_versions_follow_the_research() -> None:
    sglang = catalog("sglang")
    assert sglang["enable-piecewise-cuda-graph"].versions == ("0.5.6", "0.5.9")
    assert sglang["enforce-piecewise-cuda-graph"].since == "0.5.10"
    assert sglang["enable-single-batch-overlap"].since == "0.5.3"
    assert catalog("vllm")["spec-tokens"].since == "0.33.0"


def test_lookup_accepts_dashes_underscores_and_aliases() -> None:
    assert lookup_flag("sglang", "--tp") is catalog("sglang")["tp-size"]
    assert lookup_flag("sglang", "tensor-parallel-size") is catalog("sglang")["tp-size"]
    assert lookup_flag("sglang", "speculative_num_steps") is catalog("sglang")["speculative-num-steps"]
    assert lookup_flag("vllm", "-tp") is catalog("vllm")["tensor-parallel-size"]
    assert lookup_flag("vllm", "speculative-num-steps") is None


def test_closest_flag_suggests_the_real_name() -> None:
    assert closest_flag("sglang", "speculative-num-step") == "speculative-num-steps"
    assert closest_flag("sglang", "--enable-metric") == "enable-metrics"
    assert closest_flag("vllm", "enforce_eagre") == "enforce-eager"
    assert closest_flag("vllm", "zzzz") is None


def test_check_value_says_expected_and_got() -> None:
    tp = catalog("sglang")["tp-size"]
    with pytest.raises(FlagError, match="expected an integer, got string '2'"):
        check_value(tp, "2")
    with pytest.raises(FlagError, match="expected an integer"):
        check_value(tp, True)
    assert check_value(catalog("sglang")["mem-fraction-static"], 1) == 1.0
    with pytest.raises(FlagError, match="expected one of EAGLE, EAGLE3, NEXTN"):
        check_value(catalog("sglang")["speculative-algorithm"], "MEDUSA")
    assert check_value(catalog("sglang")["cuda-graph-bs"], [1, 2, 4]) == "1 2 4"
    assert check_value(catalog("vllm")["optimization-level"], 3) == "3"


def test_parse_value_from_the_command_line() -> None:
    eager = catalog("vllm")["enforce-eager"]
    assert parse_value(eager, "true") is True
    assert parse_value(eager, "False") is False
    with pytest.raises(FlagError, match="expected true or false, got 'yes'"):
        parse_value(eager, "yes")
    assert parse_value(catalog("vllm")["speculative-config"], '{"method":"ngram"}') == {"method": "ngram"}
    with pytest.raises(FlagError, match="JSON object"):
        parse_value(catalog("vllm")["speculative-config"], "[1, 2]")
    with pytest.raises(FlagError, match="expected a number"):
        parse_value(catalog("sglang")["mem-fraction-static"], "lots")


def test_render_flag() -> None:
    sglang, vllm = catalog("sglang"), catalog("vllm")
    assert render_flag(sglang["enable-metrics"], True) == ["--enable-metrics"]
    assert render_flag(sglang["enable-metrics"], False) == []
    assert render_flag(vllm["enable-prefix-caching"], False) == ["--no-enable-prefix-caching"]
    assert render_flag(vllm["speculative-config"], {"method": "ngram", "num_speculative_tokens": 3}) == [
        "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}']
    assert render_flag(sglang["cuda-graph-bs"], "1 2 4") == ["--cuda-graph-bs", "1", "2", "4"]
    assert render_flag(sglang["mem-fraction-static"], 0.88) == ["--mem-fraction-static", "0.88"]
