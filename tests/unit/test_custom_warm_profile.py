"""A custom profile's [warm] table (its own daemon): the reader's errors, the daemon's and client's argv, the cache
key and the readiness rule (no processes; the simulated host's lifecycle: tests/integration/test_warm_custom_sim.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from app.core.profiles.loading import parse_profile
from app.core.profiles.types import CustomDaemon, ProfileError
from app.core.server.warm import (
    client_argv,
    custom_ready,
    daemon_argv,
    daemon_profile,
    key_change,
    key_flags,
    warm_refusal,
)

SOURCE = Path("/srv/profiles/hog.toml")
BASE = 'backend = "custom"\nhost = "local"\ngpus = [0]\nport = 9000\ncommand = ["hog", "--role", "engine"]\n' \
       'ready_regex = "engine ready"\n'
WARM = '[warm]\ndaemon = ["{python}", "{profile_dir}/hog.py", "--port={port}"]\nready_regex = "daemon ready"\n'


def error_of(text: str) -> str:
    with pytest.raises(ProfileError) as caught:
        parse_profile(text, SOURCE)
    return str(caught.value)


def test_a_warm_table_names_the_daemon_and_the_client_args() -> None:
    profile = parse_profile(BASE + 'python = "/py"\n' + WARM + 'ready_file = "/tmp/d.ready"\n'
                            'client_args = ["--daemon-file", "/tmp/d.ready"]\n[flags]\nmib = 64\n', SOURCE)
    assert profile.warm is True
    assert profile.daemon == CustomDaemon(("{python}", "{profile_dir}/hog.py", "--port={port}"), "daemon ready",
                                          "/tmp/d.ready", ("--daemon-file", "/tmp/d.ready"))
    assert daemon_argv(profile) == ["/py", "/srv/profiles/hog.py", "--port=9000"]
    assert client_argv(profile) == ["hog", "--role", "engine", "--mib", "64", "--daemon-file", "/tmp/d.ready"]
    assert warm_refusal(profile, None) == ""
    assert daemon_profile(profile).name == "hog+weight-cache"


def test_the_cache_key_is_the_daemons_rendered_command() -> None:
    profile = parse_profile(BASE + WARM + "[flags]\nmib = 64\n", SOURCE)
    engine_changed = replace(profile, flags={"mib": 128})
    assert key_change("custom", key_flags(profile), key_flags(engine_changed)) == ()  # the engine's flags keep it
    moved = replace(profile, port=9001)  # {port} is in the daemon's command
    assert key_change("custom", key_flags(profile), key_flags(moved)) == ("the daemon's command",)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("warm = true\n", 'warm: a custom profile names its daemon: replace warm = true with a [warm] table'),
        ('warm = "yes"\n', "warm: expected true or false, got string 'yes'"),
        ('[warm]\nready_regex = "up"\n', "warm.daemon: missing; name the daemon's command"),
        ('[warm]\ndaemon = []\nready_regex = "up"\n', "warm.daemon: empty"),
        ('[warm]\ndaemon = "hog"\nready_regex = "up"\n', "warm.daemon: expected an array, got string 'hog'"),
        ('[warm]\ndaemon = ["hog", 1]\nready_regex = "up"\n', "warm.daemon[1]: expected a string (quote it)"),
        ('[warm]\ndaemon = ["hog"]\n', "warm.ready_regex: the daemon needs a ready signal"),
        ('[warm]\ndaemon = ["hog"]\nready_regex = "up("\n', "warm.ready_regex: not a valid regular expression"),
        ('[warm]\ndaemon = ["hog"]\nready_file = "d.ready"\n',
         "warm.ready_file: expected an absolute path on the host (or one under {profile_dir}), got 'd.ready'"),
        ('[warm]\ndaemon = ["hog", "{gpu}"]\nready_regex = "up"\n', "warm.daemon[1]: unknown placeholder {gpu}"),
        ('[warm]\ndaemon = ["hog", "{model}"]\nready_regex = "up"\n',
         "warm.daemon[1]: uses {model} but the profile sets no model"),
        ('[warm]\ndaemon = ["hog"]\nready_regex = "up"\nclient_args = ["--x", 2]\n',
         "warm.client_args[1]: expected a string"),
        ('[warm]\ndaemon = ["hog"]\nready_regex = "up"\nready_fle = "/x"\n',
         "warm.ready_fle: unknown key; did you mean 'ready_file'"),
    ],
)
def test_warm_table_errors_name_the_file_and_the_key(body: str, expected: str) -> None:
    message = error_of(BASE + body)
    assert message.startswith(f"{SOURCE}: ")
    assert expected in message


def test_a_warm_table_is_for_the_custom_backend_only() -> None:
    message = error_of('backend = "sglang"\nmodel = "m"\n[warm]\ndaemon = ["d"]\nready_regex = "up"\n')
    assert message == (f"{SOURCE}: warm: a [warm] table names a custom profile's daemon; the sglang backend's daemon "
                       "is known: write warm = true")


def test_a_warm_table_problem_is_listed_with_the_others() -> None:
    message = error_of(BASE + 'ready_timeout = 0\n[warm]\ndaemon = ["hog"]\n')
    assert "2 problems:" in message
    assert "warm.ready_regex: the daemon needs a ready signal" in message and "ready_timeout: expected" in message


def test_ready_needs_each_signal_the_profile_names() -> None:
    both = CustomDaemon(("d",), ready_regex=r"daemon: all \d+ ranks hold", ready_file="/tmp/d.ready")
    line = "gpu_hog daemon: all 1 ranks hold 64 MiB (ready, daemon)"
    assert custom_ready(both, f"loading\n{line}\n", file_age_s=0.2, since_spawn_s=1.0)
    assert not custom_ready(both, "loading\n", file_age_s=0.2, since_spawn_s=1.0)  # the line is missing
    assert not custom_ready(both, line, file_age_s=None, since_spawn_s=1.0)  # the file is missing
    file_only = CustomDaemon(("d",), ready_file="/tmp/d.ready")
    assert custom_ready(file_only, "", file_age_s=0.2, since_spawn_s=1.0)
    assert not custom_ready(file_only, "", file_age_s=30.0, since_spawn_s=1.0)  # left by an earlier daemon


def test_a_custom_profile_without_a_daemon_cannot_run_warm() -> None:
    profile = parse_profile(BASE, SOURCE)
    assert "a custom profile names its daemon in a [warm] table" in warm_refusal(replace(profile, warm=True), None)
