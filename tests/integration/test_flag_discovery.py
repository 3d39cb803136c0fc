"""Flag discovery on this machine: `--help` of a fake server package asked once and cached, a missing python
named (real processes through LocalHost; the help parser itself is tested in tests/unit/test_vllm_real.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from app.core.flags import discovery
from app.core.flags.discovery import discover_flags, offered_catalog
from app.core.hosts.local import LocalHost

FAKE_SERVER = '''
import argparse
p = argparse.ArgumentParser()
p.add_argument("--model")
p.add_argument("--max-num-seqs", type=int)
p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
p.parse_args()
'''


async def test_discovery_asks_help_once_then_reads_the_cache(tmp_path: Path) -> None:
    package = tmp_path / "lib" / "fakesrv"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "api.py").write_text(FAKE_SERVER)
    host = LocalHost("local", extra_env={"PYTHONPATH": str(tmp_path / "lib")}, state_dir=str(tmp_path / "state"))
    found = await discover_flags(host, "vllm", sys.executable, "fakesrv.api")
    assert found.known and not found.cached
    assert {"model", "max-num-seqs", "enable-prefix-caching", "no-enable-prefix-caching"} <= (found.flags or set())
    discovery._memory.clear()  # a new tunedash process
    again = await discover_flags(host, "vllm", sys.executable, "fakesrv.api")
    assert again.cached and again.flags == found.flags
    (package / "new.py").write_text("")  # a reinstall changes the package folder: asked again
    os.utime(package, ns=(1, 1))
    fresh = await discover_flags(host, "vllm", sys.executable, "fakesrv.api")
    assert not fresh.cached


async def test_discovery_of_a_missing_python_says_why(tmp_path: Path) -> None:
    host = LocalHost("local", state_dir=str(tmp_path))
    found = await discover_flags(host, "vllm", str(tmp_path / "nope" / "python"), "vllm.entrypoints.openai.api_server")
    assert found.flags is None and "nope/python" in found.reason
    assert found.accepts(offered_catalog("vllm", None)["model"]) is None
