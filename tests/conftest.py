"""Every shared fixture (test modules never import fixtures from each other): a fresh simulated host and a
demo-like profile on it, the loopback sshd and a profile behind it. Tests never read or write the developer's own
config, data, state or cache (theme.toml, keys.toml, profiles, the history): the XDG folders point into one scratch
folder for the session, set here before anything of app.tui reads them."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

USER_DIRS = Path(tempfile.mkdtemp(prefix="tunedash-tests-"))
"""The session's stand-in for the developer's XDG folders (removed when the session ends)."""
for _kind in ("CONFIG", "DATA", "STATE", "CACHE"):
    os.environ[f"XDG_{_kind}_HOME"] = str(USER_DIRS / _kind.lower())
os.environ["TUNEDASH_DATA_DIR"] = str(USER_DIRS / "history")

import pytest  # noqa: E402 - after the environment above

from app.sim.host_env import reset_state  # noqa: E402
from tests.helpers import MakeProfile, free_port, kill_launched, sim_profile_text  # noqa: E402
from tests.integration.sshd import Sshd, login_shell_sshd, open_to_all, running_sshd, sshd_available  # noqa: E402


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(USER_DIRS, ignore_errors=True)


@pytest.fixture(autouse=True)
def own_history(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test a history database of its own (the CLI subprocesses it starts inherit it): a launch's phase times
    and runs of another test's profile "t" would otherwise change what this one reads (an ETA, "instead of")."""
    folder = Path(tempfile.mkdtemp(prefix="history-", dir=USER_DIRS))
    monkeypatch.setenv("TUNEDASH_DATA_DIR", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def sim_state(tmp_path: Path) -> Path:
    """A fresh simulated host in tmp_path/sim: 2 GPUs, 0.3 s release delay, a 0.4 s server startup unless
    the server's environment (TUNEDASH_SIM_STARTUP_S, which every profile here sets) says otherwise."""
    return reset_state(tmp_path / "sim", startup_s=0.4)


@pytest.fixture
def make_profile(tmp_path: Path, sim_state: Path) -> Iterator[MakeProfile]:
    """Write tmp_path/NAME.toml, a demo-like profile on `sim_state` with a free port (keyword arguments of
    tests.helpers.sim_profile_text); kill whatever it launched afterwards."""

    def make(*, name: str = "t", **options: Any) -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(sim_profile_text(name=name, port=free_port(), sim_state=sim_state, **options))
        return path

    yield make
    kill_launched(sim_state)


# ---- the loopback sshd (tests/integration/sshd.py) -------------------------------------------------------
@pytest.fixture(scope="session")
def sshd() -> Iterator[Sshd]:
    """One sshd for the test session (skips when OpenSSH's server is not installed)."""
    if not sshd_available():
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    with running_sshd() as server:
        yield server


@pytest.fixture(scope="session")
def sshd_fish() -> Iterator[Sshd]:
    """An sshd whose user `tdtest-fish` has fish as its login shell (it parses quotes unlike POSIX shells)."""
    yield from login_shell_sshd("/usr/bin/fish")


@pytest.fixture(scope="session")
def sshd_tcsh() -> Iterator[Sshd]:
    """An sshd whose user `tdtest-tcsh` has tcsh, a csh, as its login shell."""
    yield from login_shell_sshd("/usr/bin/tcsh")


@pytest.fixture
def ssh_tmp() -> Iterator[Path]:
    """A scratch folder both this process and the SSH test user can read and write."""
    folder = Path(tempfile.mkdtemp(prefix="tunedash-ssh-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def ssh_profile(sshd: Sshd, ssh_tmp: Path) -> Iterator[Callable[..., Path]]:
    """A demo-like profile whose host is ssh://tdtest@127.0.0.1:PORT and whose sim state the test user can use."""
    state = ssh_tmp / "sim"
    reset_state(state)
    open_to_all(state)

    def make(name: str = "remote", steps: int = 1, host: str | None = None) -> Path:
        """The profile file; `host` (default: the sshd's ssh:// URL) may be an ~/.ssh/config alias."""
        path = ssh_tmp / f"{name}.toml"
        path.write_text(
            f'name = "{name}"\nhost = "{host or sshd.spec}"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\n'
            f'python = "{sys.executable}"\nmodule = "app.sim.sglang"\n'
            f'port = {free_port()}\ngpus = [0, 1]\nsim_state = "{state}"\n'
            'env = { TUNEDASH_SIM_STARTUP_S = "0.5" }\n'
            "[flags]\ntp-size = 2\nmem-fraction-static = 0.88\nspeculative-algorithm = \"NEXTN\"\n"
            f"speculative-num-steps = {steps}\nspeculative-eagle-topk = 1\n"
            f"speculative-num-draft-tokens = {steps + 1}\ndecode-log-interval = 40\n"
        )
        return path

    yield make
    kill_launched(state)



@pytest.fixture
def slurm_conf(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The one-node Slurm of scripts/slurm-local (skips, saying why, when it is not up): SLURM_CONF points at it
    for every Slurm command this test runs."""
    from tests.slurm_local import SLURM_CONF, slurm_missing

    missing = slurm_missing()
    if missing:
        pytest.skip(missing)
    monkeypatch.setenv("SLURM_CONF", str(SLURM_CONF))
    return SLURM_CONF


@pytest.fixture
def slurm_profile(slurm_conf: Path, tmp_path: Path, sim_state: Path) -> Iterator[MakeProfile]:
    """Write tmp_path/NAME.toml: the demo-like profile of make_profile, but `host = "slurm:local"` with a [slurm]
    table (`slurm` keyword: its lines; default a 30-minute allocation): the simulated host on the node of a real
    allocation of scripts/slurm-local. Afterwards the allocation it asked for is cancelled (its steps with it)."""

    def make(*, name: str = "t", slurm: str = 'time = "30"', **options: Any) -> Path:
        extra = options.pop("extra", "")
        extra = (f'python = "{sys.executable}"\nmodule = "app.sim.sglang"\n{extra}\n[slurm]\n{slurm}\n')
        text = sim_profile_text(name=name, port=free_port(), sim_state=sim_state, extra=extra, **options)
        path = tmp_path / f"{name}.toml"
        path.write_text(text.replace('host = "sim"', 'host = "slurm:local"'))
        return path

    yield make
    allocation = sim_state / "host" / "slurm" / "allocation"
    if allocation.exists():
        import subprocess

        subprocess.run(["scancel", allocation.read_text().split()[0]], check=False)
    kill_launched(sim_state)
