"""Bad profile files are errors naming the file and the key (or line), never tracebacks: bytes that are not UTF-8,
a NUL anywhere, ports outside 1-65535, GPU indices that are not integers >= 0, and a name that is not a simple
identifier (it names the job record and log files on the host, so `../../x` must not get through)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.core.profiles.loading import load_profile, parse_profile
from app.core.profiles.types import ProfileError
from tests.helpers import REPO

BASE = 'backend = "sglang"\nmodel = "m"\nhost = "local"\n'


def _fails(tmp_path: Path, text: str | bytes, *, file: str = "p.toml") -> str:
    path = tmp_path / file
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    message = str(caught.value)
    assert message.startswith(str(path)), message  # the file is named first
    return message


def test_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path: Path) -> None:
    message = _fails(tmp_path, b'backend = "sglang"\nmodel = "caf\xe9"\n')
    assert "p.toml:2: not UTF-8" in message and "0xe9" in message


def test_a_raw_nul_names_its_line(tmp_path: Path) -> None:
    assert "p.toml:4: a NUL byte" in _fails(tmp_path, BASE.encode() + b'description = "a\x00b"\n')


@pytest.mark.parametrize(("line", "key"), [
    ('model = "m\\u0000"', "model"),
    ('[env]\nX = "a\\u0000"', "env.X"),
    ('[flags]\n"tp\\u0000" = 2', "flags.tp\\0"),
    ('command = ["a", "b\\u0000"]', "command[1]"),
])
def test_an_escaped_nul_names_its_key(tmp_path: Path, line: str, key: str) -> None:
    text = 'backend = "sglang"\nhost = "local"\n' + ("" if line.startswith("model") else 'model = "m"\n') + line + "\n"
    message = _fails(tmp_path, text)
    assert f": {key}: contains a NUL character" in message


@pytest.mark.parametrize(("line", "key"), [
    ("port = 0", "port"),
    ("port = 65536", "port"),
    ("port = -1", "port"),
    ('host = "ssh://gpu:99999"', "host"),
    ('host = "ssh://gpu:0"', "host"),
    ('host = "ssh://[::1"', "host"),  # was an UnboundLocalError
])
def test_ports_outside_1_to_65535_name_the_key(tmp_path: Path, line: str, key: str) -> None:
    text = BASE.replace('host = "local"\n', "") + line + "\n"
    assert f": {key}: " in _fails(tmp_path, text)


def test_a_health_url_port_outside_the_range_is_an_error(tmp_path: Path) -> None:
    text = ('backend = "custom"\ncommand = ["srv"]\nhealth_url = "http://127.0.0.1:99999/health"\n')
    assert ": health_url: the port" in _fails(tmp_path, text)
    ok = parse_profile('backend = "custom"\nport = 9000\ncommand = ["srv"]\nhealth_url = "http://h:{port}/x"\n',
                       tmp_path / "ok.toml")
    assert ok.health_url == "http://h:{port}/x"


@pytest.mark.parametrize(("value", "key"), [
    ("[-1]", "gpus[0]"), ("[0, 1.5]", "gpus[1]"), ("[true]", "gpus[0]"), ('["0"]', "gpus[0]"), ("3", "gpus"),
])
def test_gpus_must_be_integers_not_below_zero(tmp_path: Path, value: str, key: str) -> None:
    assert f": {key}: expected" in _fails(tmp_path, BASE + f"gpus = {value}\n")


@pytest.mark.parametrize("name", ["../../x", "", "a b", ".hidden", "-x", "x/y", "x" * 65, "caf\u00e9", "a\tb"])
def test_a_name_that_is_not_a_simple_identifier_is_an_error(tmp_path: Path, name: str) -> None:
    escaped = name.replace("\\", "\\\\").replace("\t", "\\t")
    assert ": name: expected a simple name" in _fails(tmp_path, BASE + f'name = "{escaped}"\n')


def test_simple_names_pass_and_a_file_name_must_be_one_too(tmp_path: Path) -> None:
    for name in ("qwen3.6-27b-2xa6000", "A_b.c-d", "x" * 64, "0"):
        assert parse_profile(BASE + f'name = "{name}"\n', tmp_path / "p.toml").name == name
    assert parse_profile(BASE, tmp_path / "from-file.toml").name == "from-file"
    assert ": name: the file name 'my profile'" in _fails(tmp_path, BASE, file="my profile.toml")
    assert parse_profile(BASE + 'name = "ok"\n', tmp_path / "my profile.toml").name == "ok"


def test_deep_nesting_is_an_error_not_a_recursion_traceback(tmp_path: Path) -> None:
    assert "nested too deeply" in _fails(tmp_path, BASE + "x = " + "[" * 100_000 + "\n")


@pytest.mark.parametrize("content", [b'backend = "sglang"\nmodel = "\xff"\n', BASE.encode() + b'name = "../../x"\n',
                                     BASE.encode() + b"\x00\n", BASE.encode() + b"port = 70000\n"])
def test_tunedash_status_on_a_bad_file_prints_one_line_and_exits_2(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    program = "import sys; from app.cli.main import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", program, "status", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, output
    assert len(output.splitlines()) == 1 and str(path) in output and "Traceback" not in output


def test_every_problem_of_a_file_is_named_at_once(tmp_path: Path) -> None:
    text = (BASE + 'port = 0\ngpus = [0, "1"]\ncolour = "red"\n[env]\nX = 3\n'
            '[flags]\ntp-szie = 2\nmem-fraction-static = "lots"\n[bench]\nrequests = 0\n')
    message = _fails(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'p.toml'}: 7 problems:\n"), message
    for key in ("colour: unknown key", "port: expected 1-65535, got 0", "gpus[1]: expected a GPU index",
                "env.X: expected a string", "flags.tp-szie:", "tp-size", "flags.mem-fraction-static:",
                "bench.requests: expected an integer >= 1"):
        assert key in message, (key, message)


def test_the_problems_come_as_a_list_a_ui_can_show(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(BASE + 'port = 0\nready_timeout = 0\n')
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    assert caught.value.problems == ("port: expected 1-65535, got 0",
                                     "ready_timeout: expected seconds to wait for READY (1 or more), got 0")
    assert caught.value.title == "Bad profile"
