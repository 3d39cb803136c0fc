"""`tunedash prewarm` and `tunedash status` on a model folder of this machine, and the page cache read over SSH
(the host-side script through a real sshd) (issue 20 item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.hosts.ssh import SshHost
from app.core.telemetry.pagecache import read_page_cache
from tests.helpers import REPO
from tests.integration.sshd import Sshd
from tests.unit.test_pagecache import drop, model_folder


def profile_for(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "weights.toml"
    path.write_text(f'name = "weights"\nhost = "local"\nbackend = "sglang"\nmodel = "{model}"\n'
                    'python = "/nonexistent/python3"\nport = 39991\ngpus = []\n')
    return path


def tunedash(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=env, stdin=subprocess.DEVNULL, check=False)


def test_prewarm_into_a_pipe_reads_each_file_and_ends_resident(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, (16, 8, 8))
    profile = profile_for(tmp_path, str(folder))
    drop(folder)
    done = tunedash(tmp_path, "prewarm", str(profile))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("before: ") and "3 files" in lines[0]
    assert [line.split(":")[0] for line in lines[1:4]] == [
        f"read model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert "32 MiB of 32 MiB (100%)" in lines[3]
    assert lines[4].startswith("after: 32 MiB of 32 MiB in the page cache (100%, 3 files); read in ")
    assert "\r" not in done.stdout  # plain lines when piped, no progress bar


def test_status_says_how_much_of_the_model_is_in_the_page_cache(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    for path in folder.glob("*.safetensors"):
        path.read_bytes()
    profile = profile_for(tmp_path, str(folder))
    text = tunedash(tmp_path, "status", str(profile))
    assert "  weights: 12 MiB of 12 MiB in the page cache (100%, 2 files)" in text.stdout.splitlines(), text.stdout
    data = json.loads(tunedash(tmp_path, "status", str(profile), "--json").stdout)
    assert data["page_cache"] == {"model": str(folder), "total_bytes": 12 << 20, "resident_bytes": 12 << 20,
                                  "fraction": 1.0, "files": 2, "tool": "mincore", "reason": None}


def test_prewarm_of_a_model_that_is_not_a_folder_says_why(tmp_path: Path) -> None:
    done = tunedash(tmp_path, "prewarm", str(profile_for(tmp_path, "Qwen/Qwen3.6-27B")))
    assert done.returncode == 2
    assert "Qwen/Qwen3.6-27B on local: not a folder" in done.stdout
    assert "folder of .safetensors files" in done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.ssh
async def test_the_page_cache_over_ssh_matches_the_local_reading(sshd: Sshd, ssh_tmp: Path) -> None:
    folder = model_folder(ssh_tmp)
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o755)
    for path in folder.glob("*.safetensors"):
        path.read_bytes()
    host = SshHost(sshd.spec, options=sshd.options(), state_dir=str(ssh_tmp / "state"))
    try:
        remote = await read_page_cache(host, str(folder))
        missing = await read_page_cache(host, str(ssh_tmp / "nowhere"))
    finally:
        await host.close()
    assert remote.tool in ("fincore", "python3 mincore"), remote.reason
    assert remote.fraction == 1.0 and remote.total_bytes == 12 << 20 and len(remote.files) == 2
    assert missing.fraction is None and missing.reason.endswith("not a folder")
