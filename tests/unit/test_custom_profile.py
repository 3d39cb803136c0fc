"""The custom backend's profile schema, argv rendering, free-form flags and log parsing (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.data import FatalEvent, PhaseEvent, ReadyEvent
from app.core.flags.toggles import default_toggles
from app.core.flags.values import catalog
from app.core.logs.parser import LogParser
from app.core.profiles.loading import apply_overrides, parse_profile
from app.core.profiles.render import health_url, launch_argv
from app.core.profiles.types import ProfileError

SOURCE = Path("/srv/profiles/mine.toml")
BASE = 'backend = "custom"\nhost = "local"\ngpus = []\n'


def custom(extra: str) -> str:
    return BASE + extra


def error_of(text: str) -> str:
    with pytest.raises(ProfileError) as caught:
        parse_profile(text, SOURCE)
    return str(caught.value)


def test_command_is_rendered_with_placeholders_and_free_form_flags() -> None:
    profile = parse_profile(custom(
        'python = "/opt/py/bin/python3"\nmodel = "tiny"\nport = 8123\n'
        'command = ["{python}", "{profile_dir}/serve.py", "--listen=:{port}", "-m", "{model}", "{\\"json\\": 1}"]\n'
        'ready_regex = "listening"\n'
        '[flags]\nctx-size = 4096\n"--threads" = 8\ntemperature = 0.5\nverbose = true\nquiet = false\nname = "x y"\n'
    ), SOURCE)
    assert launch_argv(profile) == [
        "/opt/py/bin/python3", f"{SOURCE.parent.resolve()}/serve.py", "--listen=:8123", "-m", "tiny", '{"json": 1}',
        "--ctx-size", "4096", "--threads", "8", "--temperature", "0.5", "--verbose", "--name", "x y",
    ]
    assert profile.toggles == ()
    assert catalog("custom") == {}
    assert default_toggles("custom") == ()


def test_set_adds_and_changes_free_form_flags_and_the_port() -> None:
    profile = parse_profile(custom('port = 9000\ncommand = ["srv", "{port}"]\nready_regex = "up"\n'
                                   "[flags]\nbatch = 4\n"), SOURCE)
    changed = apply_overrides(profile, ["batch=16", "fast=true", "mode=turbo", "port=9100"], [])
    assert launch_argv(changed) == ["srv", "9100", "--batch", "16", "--fast", "--mode", "turbo"]
    assert launch_argv(apply_overrides(changed, [], ["fast"]))[-2:] == ["--mode", "turbo"]


def test_health_url_gets_the_port() -> None:
    profile = parse_profile(custom('port = 8200\ncommand = ["srv"]\nhealth_url = "http://127.0.0.1:{port}/ping"\n'),
                            SOURCE)
    assert health_url(profile) == "http://127.0.0.1:8200/ping"
    assert profile.ready_regex == ""
    assert profile.model == ""


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('ready_regex = "up"\n', "command: missing; a custom profile needs command ="),
        ('command = []\nready_regex = "up"\n', "command: empty"),
        ('command = ["srv", 3]\nready_regex = "up"\n', "command[1]: expected a string (quote it), got integer 3"),
        ('command = ["srv"]\n', "ready_regex: a custom profile needs a ready signal"),
        ('command = ["srv"]\nready_regex = "up("\n', "ready_regex: not a valid regular expression"),
        ('command = ["srv"]\nhealth_url = "127.0.0.1/health"\n', "health_url: expected an http:// or https:// URL"),
        ('command = ["srv", "{gpu}"]\nready_regex = "up"\n', "command[1]: unknown placeholder {gpu}"),
        ('command = ["srv", "--port={port}"]\nready_regex = "up"\n',
         "command[1]: uses {port} but the profile sets no port; add port = ..."),
        ('command = ["srv"]\nhealth_url = "http://h:{port}/"\n',
         "health_url: uses {port} but the profile sets no port"),
        ('command = ["srv", "{model}"]\nready_regex = "up"\n', "uses {model} but the profile sets no model"),
        ('module = "x"\ncommand = ["srv"]\nready_regex = "up"\n', "module: a custom profile runs `command`"),
        ('command = ["srv"]\nready_regex = "up"\nport = 0\n', "port: expected 1-65535, got 0"),
        ('command = ["srv"]\nready_regex = "up"\n[flags]\nlayers = [1, 2]\n',
         "flags.layers: expected true/false, a number or a string (put anything else in `command`)"),
    ],
)
def test_schema_errors_name_the_file_and_the_key(body: str, expected: str) -> None:
    message = error_of(custom(body))
    assert message.startswith(f"{SOURCE}: ")
    assert expected in message


def test_command_keys_belong_to_the_custom_backend_only() -> None:
    message = error_of('backend = "sglang"\nmodel = "m"\ncommand = ["srv"]\n')
    assert message == (f'{SOURCE}: command: only a backend = "custom" profile runs its own command; remove command '
                       'or set backend = "custom"')
    assert 'backend: expected one of sglang, vllm, custom, got' in error_of('backend = "tgi"\nmodel = "m"\n')


def test_parser_for_custom_is_ready_on_the_regex_only() -> None:
    parser = LogParser("custom", ready_regex=r"ranks hold \d+ MiB")
    events = []
    for line in [
        "[2026-11-30 10:00:00] The server is fired up and ready to roll!",  # SGLang's line means nothing here
        "[2026-11-30 10:00:00 TP0] Load weight begin. avail mem=79.10 GB",
        "[2026-11-30 10:00:01 TP0] Decode batch, #running-req: 1, gen throughput (token/s): 50.00",
        "gpu_hog: all 2 ranks hold 512 MiB (ready)",
        "gpu_hog: all 2 ranks hold 512 MiB (ready)",
    ]:
        events.extend(parser.feed(line))
    assert [type(e) for e in events] == [ReadyEvent]
    assert isinstance(events[0], ReadyEvent) and events[0].line.number == 4


def test_parser_for_custom_keeps_fatal_and_traceback_detection() -> None:
    parser = LogParser("custom", ready_regex="up")
    events = []
    for line in ["starting", "Traceback (most recent call last):", '  File "srv.py", line 3, in <module>',
                 "    main()", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "bye"]:
        events.extend(parser.feed(line))
    events.extend(parser.flush())
    fatals = [e for e in events if isinstance(e, FatalEvent)]
    assert len(fatals) == 1
    assert fatals[0].kind == "oom"
    assert "CUDA out of memory" in fatals[0].text


def test_ready_regex_adds_a_ready_line_to_a_known_backend() -> None:
    parser = LogParser("sglang", ready_regex="custom banner")
    events = parser.feed("[2026-11-30 10:00:00 TP0] Load weight begin. avail mem=79.10 GB")
    events += parser.feed("custom banner")
    assert [type(e) for e in events] == [PhaseEvent, ReadyEvent]
