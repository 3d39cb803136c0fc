"""SSH host specs and ssh config values checked where they enter, without a server: a bad `tunedash trust`
argument or ProxyJump entry is an error naming it (never a traceback), and the name a host key is trusted
under is the one OpenSSH looks up, read off OpenSSH's own `ssh -G`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from app.cli.main import main as cli_main
from app.core.hosts.base import HostError
from app.core.hosts.ssh import SshHost
from app.core.hosts.ssh_options import SshTarget, settings_for

BAD_SPECS = ["ssh://h:99999", "ssh://h:0", "ssh://h:port", "ssh://", "ssh://[::1", "ssh://h/some/path",
             "ssh://h?x=1", "ssh://u:secret@h", "ssh://h:-1", "ssh://-oProxyCommand=x"]


@pytest.fixture(autouse=True)
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No real ~/.ssh is read: HOME is an empty folder."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_a_bad_host_spec_is_an_error_naming_it(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["trust", spec]) == 2
    err = capsys.readouterr().err
    assert spec in err and "Traceback" not in err, err
    with pytest.raises(HostError, match="ssh://"):
        SshHost(spec)


def write_config(folder: Path, text: str) -> Path:
    path = folder / "ssh_config"
    path.write_text(text)
    return path


def test_a_bad_proxy_jump_entry_or_a_jump_loop_is_an_error_naming_the_host(tmp_path: Path) -> None:
    config = write_config(tmp_path, "Host bad\n  ProxyJump user@:99999\nHost a\n  ProxyJump b\nHost b\n  ProxyJump a\n")
    with pytest.raises(HostError, match=r"bad: cannot read the ProxyJump entry 'user@:99999'"):
        settings_for(SshTarget.parse("bad"), {"config": [config]})
    with pytest.raises(HostError, match=r"does ProxyJump in ~/\.ssh/config loop"):
        settings_for(SshTarget.parse("a"), {"config": [config]})


def test_known_hosts_checking_cannot_be_turned_off_by_the_caller() -> None:
    with pytest.raises(HostError, match="cannot be turned off"):
        settings_for(SshTarget.parse("ssh://h"), {"known_hosts": None, "config": None})


@pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH's client is not installed")
def test_the_trusted_name_and_file_are_what_openssh_looks_up(tmp_path: Path) -> None:
    config = write_config(tmp_path, (
        "Host plain\n  HostName Box.Example.COM\n"
        f"Host ported\n  HostName 10.1.2.3\n  Port 2222\n  UserKnownHostsFile {tmp_path}/team {tmp_path}/more\n"
        "Host aliased\n  HostName 10.1.2.4\n  Port 2200\n  HostKeyAlias gpu-key\n"
        "Host jumped\n  HostName 10.1.2.5\n  ProxyJump ported\n"
    ))
    for alias in ("plain", "ported", "aliased", "jumped"):
        said = subprocess.run(["ssh", "-F", str(config), "-G", alias], capture_output=True, text=True, check=True,
                              stdin=subprocess.DEVNULL).stdout
        openssh = dict(line.split(" ", 1) for line in said.splitlines() if " " in line)
        port = int(openssh["port"])
        name = openssh.get("hostkeyalias") or (
            openssh["hostname"] if port == 22 else f"[{openssh['hostname']}]:{port}")
        settings = settings_for(SshTarget.parse(alias), {"config": [config]})
        assert (settings.hostname.lower(), settings.port) == (openssh["hostname"], port)
        assert settings.known_hosts_name == name, alias
        first_file = openssh["userknownhostsfile"].split()[0]
        if first_file.startswith(str(tmp_path)):  # ssh -G expands ~ from the password file, not $HOME
            assert settings.trust_file == first_file
        else:
            assert settings.trust_file == str(Path("~/.ssh/known_hosts").expanduser())
    jumped = settings_for(SshTarget.parse("jumped"), {"config": [config]})
    assert jumped.via is not None and jumped.via.known_hosts_name == "[10.1.2.3]:2222"
    assert jumped.via.label == "ported (the jump host to jumped)"


def test_user_known_hosts_file_none_keeps_checking_in_the_default_file(tmp_path: Path, empty_home: Path) -> None:
    config = write_config(tmp_path, "Host box\n  HostName 10.0.0.9\n  UserKnownHostsFile none\n"
                                    "  StrictHostKeyChecking no\n  ForwardAgent yes\n  RequestTTY force\n")
    settings = settings_for(SshTarget.parse("box"), {"config": [config]})
    assert settings.trust_file == str(empty_home / ".ssh" / "known_hosts")
    assert settings.options.known_hosts is not None
    assert settings.options.agent_forward_path is None and settings.options.request_pty is False
