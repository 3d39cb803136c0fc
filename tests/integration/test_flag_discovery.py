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


FAKE_SGLANG = '''
import argparse
from standin import __version__
if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="sglang serve")
    p.add_argument("--model-path")
    if __version__ == "0.5.10":
        p.add_argument("--enforce-piecewise-cuda-graph", action="store_true")
    else:
        p.add_argument("--cuda-graph-backend-prefill", choices=["full", "breakable", "disabled"])
    p.parse_args()
'''


async def test_sglang_discovery_reads_the_version_of_a_stand_in_and_keys_the_cache_on_it(tmp_path: Path) -> None:
    """A module outside the sglang distribution (the simulator's case) reports its own __version__; a host whose
    server changes version is asked again, and each version's flags come from its own --help."""
    package = tmp_path / "lib" / "standin"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('import os\n__version__ = os.environ.get("FAKE_SGLANG_VERSION", "0.5.10")\n')
    (package / "server.py").write_text(FAKE_SGLANG + "raise SystemExit('imported: a server module must not be')\n")
    env = {"PYTHONPATH": str(tmp_path / "lib")}
    host = LocalHost("local", extra_env=env, state_dir=str(tmp_path / "state"))
    old = await discover_flags(host, "sglang", sys.executable, "standin.server", {"FAKE_SGLANG_VERSION": "0.5.10"})
    new = await discover_flags(host, "sglang", sys.executable, "standin.server", {"FAKE_SGLANG_VERSION": "0.5.23"})
    assert (old.version, new.version) == ("0.5.10", "0.5.23")
    old_flags, new_flags = old.flags or set(), new.flags or set()
    assert "enforce-piecewise-cuda-graph" in old_flags and "cuda-graph-backend-prefill" not in old_flags
    assert "cuda-graph-backend-prefill" in new_flags and not new.cached
    assert new.describe().startswith("SGLang 0.5.23")
