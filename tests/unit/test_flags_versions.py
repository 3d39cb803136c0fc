"""Toggles that mean the same on every SGLang version, and refusals that name the flag, the version and what
replaces it (issue: SGLang as people run it today)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.core.errors import Reason
from app.core.flags.catalog import release_tuple
from app.core.flags.discovery import ServerFlags, rejection_message
from app.core.flags.toggles import apply_toggle, default_toggles, toggle_value
from app.core.profiles.loading import for_server_version, load_profile, parse_profile
from app.core.server.lifecycle import ServerLifecycle
from app.core.server.preflight import LaunchRefused
from tests.fakes import InMemoryHost, ScriptedTelemetry, gpu_reading
from tests.helpers import REPO


def _g(version: str | None):  # type: ignore[no-untyped-def]
    return next(t for t in default_toggles("sglang", version) if t.key == "g")


@pytest.mark.parametrize(("version", "release"), [("0.5.15.post1", (0, 5, 15, 1)), ("0.5.23", (0, 5, 23)),
                                                  ("0.32.0+cpu", (0, 32, 0)), ("", None), (None, None)])
def test_release_tuple(version: str | None, release: tuple[int, ...] | None) -> None:
    assert release_tuple(version) == release


@pytest.mark.parametrize(("version", "flags"), [
    (None, {"enforce-piecewise-cuda-graph": True}),
    ("0.5.10", {"enforce-piecewise-cuda-graph": True}),
    ("0.5.12", {"enforce-piecewise-cuda-graph": True}),
    ("0.5.15.post1", {"cuda-graph-backend-prefill": "breakable"}),
    ("0.5.23", {"cuda-graph-backend-prefill": "breakable"}),
])
def test_g_keeps_the_prefill_graph_on_in_each_versions_flags(version: str | None, flags: dict[str, object]) -> None:
    g = _g(version)
    on = apply_toggle({}, g)
    assert on == flags
    assert apply_toggle(on, g) == {}  # off = the flag absent
    assert g.label == "pcg"


def test_the_0523_g_toggle_reads_auto_and_breakable() -> None:
    g = _g("0.5.23")
    assert toggle_value({}, g) == "auto"
    assert toggle_value({"cuda-graph-backend-prefill": "breakable"}, g) == "breakable"


def test_a_profile_rendered_for_a_version_keeps_its_own_toggles_and_flags() -> None:
    own = '\n[toggles.x]\nflip = "enable-metrics"\n[toggles.o]\nflip = "enable-single-batch-overlap"\n'
    text = (REPO / "profiles" / "demo.toml").read_text() + own
    profile = parse_profile(text, REPO / "profiles" / "demo.toml")
    new = for_server_version(profile, "0.5.23")
    assert new.flags == profile.flags  # never rewritten
    assert new.toggle("g") is not None and new.toggle("g").flags == ("cuda-graph-backend-prefill",)  # type: ignore[union-attr]
    assert new.toggle("x") == profile.toggle("x") and new.toggle("o") == profile.toggle("o")  # own entries stay
    assert for_server_version(new, "0.5.10").toggle("g").flags == ("enforce-piecewise-cuda-graph",)  # type: ignore[union-attr]


def _found(version: str, flags: set[str]) -> ServerFlags:
    return ServerFlags("sglang", "/venv/bin/python", "sglang.launch_server", version, frozenset(flags))


def test_a_rejected_flag_is_named_with_the_version_and_what_replaces_it() -> None:
    found = _found("0.5.23", {"model-path", "tp-size", "cuda-graph-backend-prefill", "mamba-radix-cache-strategy"})
    message = rejection_message(found, {"tp-size": 2, "enforce-piecewise-cuda-graph": True,
                                        "mamba-scheduler-strategy": "extra_buffer"}, "profiles/demo.toml")
    assert message is not None
    assert "SGLang 0.5.23" in message and "profiles/demo.toml" in message
    assert "--enforce-piecewise-cuda-graph (use --cuda-graph-backend-prefill breakable instead)" in message
    assert "--mamba-scheduler-strategy (use --mamba-radix-cache-strategy instead)" in message
    assert rejection_message(found, {"tp-size": 2}, "x") is None
    unknown = ServerFlags("sglang", "p", "m", None, None, "no python")
    assert rejection_message(unknown, {"enforce-piecewise-cuda-graph": True}, "x") is None  # unknown: let it pass


async def test_a_relaunch_with_a_rejected_flag_is_refused_before_anything_is_signalled() -> None:
    host = InMemoryHost()
    profile = load_profile(REPO / "profiles" / "demo.toml")
    life = ServerLifecycle(host, replace(profile, gpus=()), ScriptedTelemetry(gpu_reading({})), grace_s=0.1)
    life.server_flags = _found("0.5.23", {"model-path", "tp-size"})
    bad = replace(profile, gpus=(), flags={**profile.flags, "enforce-piecewise-cuda-graph": True})
    with pytest.raises(LaunchRefused) as refused:
        await life.relaunch(bad)
    assert refused.value.reason == Reason.BAD_INPUT and "enforce-piecewise-cuda-graph" in str(refused.value)
    assert host.signals == [] and host.groups == {}
