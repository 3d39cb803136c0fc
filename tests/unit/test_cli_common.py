"""app.cli.common: one reason -> exit code mapping, zero means zero, hosts closed, no --set where it is moot."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from app.cli import common
from app.cli.main import build_parser
from app.core.errors import Reason
from app.core.hosts.base import HostError
from app.core.measure.experiment import ExperimentFailed
from app.core.profiles.loading import load_profile
from app.core.profiles.types import ProfileError
from app.core.server.preflight import LaunchRefused
from tests.helpers import REPO


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (LaunchRefused("already running", Reason.ALREADY_RUNNING), 2),
        (LaunchRefused("port taken", Reason.PORT_IN_USE), 4),
        (LaunchRefused("held", Reason.GPUS_HELD), 3),
        (LaunchRefused("cannot read the GPUs", Reason.GPUS_UNREADABLE), 1),
        (ExperimentFailed("arm B crashed"), 4),
        (ExperimentFailed("arm B: held", Reason.GPUS_HELD), 3),
        (common.CliError("no server", Reason.NOT_RUNNING), 2),
        (common.CliError("--requests must be at least 1"), 2),
        (ProfileError("demo.toml: unknown key"), 2),
        (HostError("cannot reach gpubox"), 2),
    ],
)
def test_every_reason_has_one_exit_code(error: Exception, code: int) -> None:
    assert common.exit_code(error) == code


def test_every_reason_is_mapped() -> None:
    assert set(common.EXIT_FOR_REASON) == set(Reason)


def test_zero_grace_and_timeout_mean_zero() -> None:
    profile = load_profile(REPO / "profiles" / "demo.toml")
    host: Any = type("H", (), {"name": "h", "subscribe_connection": lambda self, cb: None})()
    zero = common.lifecycle_for(profile, host, argparse.Namespace(grace=0.0, timeout=0.0))
    assert (zero.grace_s, zero.free_timeout_s) == (0.0, 0.0)
    unset = common.lifecycle_for(profile, host, argparse.Namespace())
    assert (unset.grace_s, unset.free_timeout_s) == (15.0, 60.0)


@pytest.mark.parametrize("command", ["status", "bench"])
def test_commands_that_look_at_the_running_server_take_no_set(command: str) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([command, "demo", "--set", "speculative-num-steps=3"])
    assert exited.value.code == 2


async def test_a_command_closes_the_hosts_it_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []

    class Host:
        name = "gpubox"

        async def close(self) -> None:
            closed.append(self.name)

    monkeypatch.setattr(common, "host_for", lambda profile: Host())
    profile = load_profile(REPO / "profiles" / "demo.toml")

    async def command() -> int:
        common.open_host(profile)
        raise HostError("connection lost")

    with pytest.raises(HostError):
        await common.run_command(command())
    assert closed == ["gpubox"]
