"""Page-cache residency of a model's safetensors files (issue 20 item 4): real files on this machine's disk,
dropped with posix_fadvise(DONTNEED), read, seen resident; the host-side script (fincore, then python3's mincore)
and its answers checked where they enter; the advisor's cold-page-cache finding on a real 0.5.23 log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.advisor.evidence import Evidence
from app.core.advisor.rules import evaluate
from app.core.data import PhaseEvent
from app.core.hosts.local import LocalHost
from app.core.logs.parser import parse_lines
from app.core.telemetry.pagecache import (
    MINCORE_PY,
    PAGE_CACHE_SCRIPT,
    FileResidency,
    PageCache,
    PrewarmProgress,
    parse_page_cache,
    prewarm,
    read_page_cache,
)
from app.tui.views import page_cache_line

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
MIB = 1 << 20


def model_folder(root: Path, sizes_mib: tuple[int, ...] = (8, 4)) -> Path:
    folder = root / "model"
    folder.mkdir()
    for i, size in enumerate(sizes_mib, start=1):
        (folder / f"model-{i:05d}-of-{len(sizes_mib):05d}.safetensors").write_bytes(os.urandom(size * MIB))
    (folder / "config.json").write_text("{}")  # not a weight file: not counted
    return folder


def drop(folder: Path) -> None:
    """Write the files back and ask the kernel to drop their pages."""
    for path in folder.glob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


async def dropped(folder: Path, host: LocalHost) -> PageCache:
    drop(folder)
    cache = await read_page_cache(host, str(folder))
    if cache.fraction is not None and cache.fraction > 0.5:
        pytest.skip(f"this filesystem keeps the pages of {folder} after DONTNEED (tmpfs?)")
    return cache


async def test_a_dropped_file_reads_cold_and_a_read_one_resident(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    host = LocalHost(state_dir=str(tmp_path / "td"))
    cold = await dropped(folder, host)
    assert cold.total_bytes == 12 * MIB and len(cold.files) == 2 and cold.tool == "mincore"
    assert (cold.fraction or 0) < 0.5
    for path in folder.glob("*.safetensors"):
        path.read_bytes()
    warm = await read_page_cache(host, str(folder))
    assert warm.fraction == 1.0 and warm.resident_bytes == 12 * MIB
    assert warm.describe() == "12 MiB of 12 MiB in the page cache (100%, 2 files)"


async def test_prewarm_reads_the_files_into_the_page_cache_with_progress(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, (20, 4))
    host = LocalHost(state_dir=str(tmp_path / "td"))
    cold = await dropped(folder, host)
    seen: list[PrewarmProgress] = []
    await prewarm(host, cold, seen.append)
    warm = await read_page_cache(host, str(folder))
    assert warm.fraction == 1.0
    assert [p.path.rsplit("/", 1)[-1] for p in seen if p.file_done] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert seen[-1].done_bytes == seen[-1].total_bytes == 24 * MIB


async def test_a_model_that_is_not_a_folder_is_not_read_not_zero(tmp_path: Path) -> None:
    host = LocalHost(state_dir=str(tmp_path / "td"))
    hub = await read_page_cache(host, "Qwen/Qwen3.6-27B")
    assert hub.fraction is None and hub.total_bytes is None and "not a folder" in hub.reason
    assert page_cache_line(hub) is None  # a hub id: no line in the Server panel
    (tmp_path / "empty").mkdir()
    empty = await read_page_cache(host, str(tmp_path / "empty"))
    assert "no .safetensors files" in empty.reason
    expected = f"weights: page cache not read: {tmp_path / 'empty'} on local: no .safetensors files"
    assert page_cache_line(empty) == expected


def script(folder: Path, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", PAGE_CACHE_SCRIPT, "sh", str(folder)], capture_output=True, text=True,
                          env={"PATH": path, "MINCORE_PY": MINCORE_PY}, timeout=30, check=False)


@pytest.mark.skipif(shutil.which("fincore") is None, reason="util-linux's fincore is not installed")
def test_the_host_script_uses_fincore_then_python3(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    for path in folder.glob("*.safetensors"):
        path.read_bytes()
    with_fincore = script(folder, os.environ["PATH"])
    only_python = tmp_path / "bin"
    only_python.mkdir()
    (only_python / "python3").symlink_to(sys.executable)
    with_python = script(folder, str(only_python))
    for result, tool in ((with_fincore, "fincore"), (with_python, "python3 mincore")):
        cache = parse_page_cache(str(folder), "h", result.returncode, result.stdout, result.stderr)
        assert cache.tool == tool, result
        assert cache.fraction == 1.0 and cache.total_bytes == 12 * MIB
        assert sorted(Path(f.path).name for f in cache.files) == sorted(p.name for p in folder.glob("*.safetensors"))
    (tmp_path / "nothing").mkdir()
    neither = script(folder, str(tmp_path / "nothing"))
    cache = parse_page_cache(str(folder), "h", neither.returncode, neither.stdout, neither.stderr)
    assert cache.fraction is None and "neither fincore (util-linux) nor python3" in cache.reason
    assert "install util-linux" in cache.reason


def test_answers_that_are_not_the_script_s_lines_are_a_reason() -> None:
    bad = parse_page_cache("/m", "gpu1", 0, "tool fincore\n4096 8192 /m/a.safetensors\ngarbage here\n", "")
    assert bad.fraction is None and "line 3 that is not `RESIDENT SIZE PATH`" in bad.reason and "gpu1" in bad.reason
    spaced = parse_page_cache("/m", "gpu1", 0, "tool fincore\n4096 8192 /m/a b.safetensors\n", "")
    assert spaced.files == (FileResidency("/m/a b.safetensors", 8192, 4096),)
    missing = parse_page_cache("/m", "gpu1", 3, "not a folder\n", "")
    assert missing.reason == "/m on gpu1: not a folder"
    unicode_digits = parse_page_cache("/m", "gpu1", 0, "tool fincore\n\u00b2 8192 /m/a.safetensors\n", "")
    assert unicode_digits.fraction is None


def weights_evidence(version: str, cache: PageCache, **flags: object) -> Evidence:
    events = parse_lines((LOGS / "sglang_0523_startup.log").read_text().splitlines(), "sglang").events
    phases = tuple(e for e in events if isinstance(e, PhaseEvent))
    return Evidence("sglang", dict(flags), version=version, phases=phases, log_lines=len(events), page_cache=cache)


def cache_of(total_gib: float, share: float) -> PageCache:
    size = int(total_gib * (1 << 30))
    return PageCache("/models/q", "gpu1", (FileResidency("/models/q/a.safetensors", size, int(size * share)),),
                     tool="fincore")


def test_the_advisor_names_a_cold_page_cache_for_a_slow_weights_phase() -> None:
    finding = {f.rule: f for f in evaluate(weights_evidence("0.5.23", cache_of(54.0, 0.1)))}["cold_page_cache"]
    assert finding.status == "advice"
    assert "cold page cache" in finding.what and "took 31.1 s" in finding.what and "10%" in finding.what
    assert any("weights took 31.1 s" in line for line in finding.evidence)
    assert "tunedash prewarm" in finding.reason and "--weight-loader-prefetch-checkpoints" in finding.reason
    # Warm now but read at disk speed (54 GiB in 31.1 s): this load filled the cache; cold at launch.
    slow = {f.rule: f for f in evaluate(weights_evidence("0.5.23", cache_of(54.0, 1.0)))}["cold_page_cache"]
    assert "1.74 GiB/s" in slow.what and "cold at launch" in slow.what
    # A small model at RAM speed: nothing to say. 0.5.10 has no prefetch flag: not offered.
    assert "cold_page_cache" not in {f.rule for f in evaluate(weights_evidence("0.5.23", cache_of(300.0, 1.0)))}
    old = {f.rule: f for f in evaluate(weights_evidence("0.5.10", cache_of(54.0, 0.1)))}["cold_page_cache"]
    assert "--weight-loader-prefetch-checkpoints" not in old.reason
    dropping = weights_evidence("0.5.23", cache_of(54.0, 0.1), **{"weight-loader-drop-cache-after-load": True})
    assert "drop that flag" in {f.rule: f for f in evaluate(dropping)}["cold_page_cache"].reason


def test_no_finding_without_the_page_cache() -> None:
    unread = PageCache("Qwen/Qwen3.6-27B", "gpu1", reason="not a folder")
    assert "cold_page_cache" not in {f.rule for f in evaluate(weights_evidence("0.5.23", unread))}
