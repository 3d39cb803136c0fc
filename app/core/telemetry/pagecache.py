"""How much of a model's safetensors files sits in a host's page cache (mincore), and reading them into it.

A weights phase reads the checkpoint: from RAM when the files are in the page cache (seconds), from the disk
when not (531 s vs 31 s for one 122B FP8 checkpoint in the project's notes). `read_page_cache(host, model)` says
which, for a model that is a folder of `*.safetensors` files on the host:

- this machine (and the simulated host): in-process, each file mapped read-only (mmap through libc) and its pages
  asked with mincore(2), through ctypes: nothing is read, nothing is started;
- an SSH host: one exec of PAGE_CACHE_SCRIPT (a fixed /bin/sh script, the folder its only argument): util-linux's
  `fincore` where the host has it, else the same mincore through the host's `python3`, else "not read" with what
  to install. Its lines are `RESIDENT_BYTES SIZE_BYTES PATH`, checked where they enter.

`prewarm(host, model, progress)` reads every file once (local: 16 MiB reads with byte progress; SSH: `cat` per
file, a progress line per file). Values that could not be read are a PageCache with `reason` set, never 0.
Why and the figures: docs/decisions.md#page-cache.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.hosts.base import Host, HostError

SUFFIX = ".safetensors"
READ_CHUNK = 16 << 20
GIB = 1 << 30

# The host side, for an SSH host: $1 is the model folder. Exit 3: not a folder; 4: no safetensors; 5: no tool.
PAGE_CACHE_SCRIPT = r"""
d=$1
[ -d "$d" ] || { echo "not a folder"; exit 3; }
set -- "$d"/*.safetensors
[ -e "$1" ] || { echo "no .safetensors files"; exit 4; }
if command -v fincore >/dev/null 2>&1 && out=$(fincore --bytes --noheadings --raw --output RES,SIZE,FILE -- "$@" 2>&1)
then echo "tool fincore"; printf '%s\n' "$out"; exit 0; fi
if command -v python3 >/dev/null 2>&1; then echo "tool python3 mincore"; exec python3 -c "$MINCORE_PY" "$@"; fi
echo "neither fincore (util-linux) nor python3 on the host"; exit 5
"""

# The same mincore as `_resident_bytes`, standalone, for a host's python3 (argv: the files).
MINCORE_PY = r"""
import ctypes, ctypes.util, mmap, os, sys
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
page = os.sysconf("SC_PAGE_SIZE")
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        resident = 0
        if size:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), "mmap failed", path)
            try:
                vec = ctypes.create_string_buffer((size + page - 1) // page)
                if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                    raise OSError(ctypes.get_errno(), "mincore failed", path)
                low = bytes(b & 1 for b in range(256))
                resident = min(size, vec.raw.translate(low).count(1) * page)
            finally:
                libc.munmap(ctypes.c_void_p(addr), size)
        print(resident, size, path)
    finally:
        os.close(fd)
"""

PREWARM_SCRIPT = r"""
for f in "$@"; do cat -- "$f" >/dev/null || exit 1; echo "read $f"; done
"""


@dataclass(frozen=True)
class FileResidency:
    """One weight file: its size and how many of its bytes are in the page cache."""

    path: str
    size: int
    resident: int


@dataclass(frozen=True)
class PageCache:
    """A model's weight files in a host's page cache. `reason` says why nothing could be read (then `files` is
    empty); `tool` says what read it ("mincore", "fincore", "python3 mincore")."""

    model: str
    host: str
    files: tuple[FileResidency, ...] = ()
    reason: str = ""
    tool: str = ""

    @property
    def total_bytes(self) -> int | None:
        return sum(f.size for f in self.files) if self.files else None

    @property
    def resident_bytes(self) -> int | None:
        return sum(f.resident for f in self.files) if self.files else None

    @property
    def fraction(self) -> float | None:
        """The share of the model's bytes in the page cache (None: not read; 1.0 for empty files)."""
        total, resident = self.total_bytes, self.resident_bytes
        if total is None or resident is None:
            return None
        return resident / total if total else 1.0

    def describe(self) -> str:
        """One line: "41.2 GiB of 54.0 GiB in the page cache (76%, 11 files)" or why it is not known."""
        total, resident, fraction = self.total_bytes, self.resident_bytes, self.fraction
        if total is None or resident is None or fraction is None:
            return f"not read: {self.reason}"
        return (f"{size_text(resident, total)} of {size_text(total)} in the page cache ({fraction:.0%}, "
                f"{len(self.files)} file{'s' if len(self.files) != 1 else ''})")


def size_text(size: int, scale: int | None = None) -> str:
    """Bytes as GiB (one decimal) from 1 GiB up, else MiB; `scale` picks the unit by another size."""
    if (scale if scale is not None else size) >= GIB:
        return f"{size / GIB:.1f} GiB"
    return f"{size / (1 << 20):.0f} MiB"


def page_cache_to_json(cache: PageCache) -> dict[str, Any]:
    """The `page_cache` object of `tunedash status --json`."""
    return {"model": cache.model, "total_bytes": cache.total_bytes, "resident_bytes": cache.resident_bytes,
            "fraction": cache.fraction, "files": len(cache.files), "tool": cache.tool or None,
            "reason": cache.reason or None}


# ---- this machine ---------------------------------------------------------------------------------------------
_LIBC: Any = None
_LOW_BIT = bytes(b & 1 for b in range(256))


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        _LIBC = libc
    return _LIBC


def resident_bytes(path: str) -> tuple[int, int]:
    """(bytes of `path` in the page cache, its size): the file mapped read-only, its pages asked with mincore(2).

    Raises OSError (the file cannot be opened or mapped) with the path in it."""
    import mmap

    libc = _libc()
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if not size:
            return 0, 0
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = ctypes.create_string_buffer((size + page - 1) // page)
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            resident = vec.raw.translate(_LOW_BIT).count(1)  # bit 0: resident; the others are undefined
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)
    return min(size, resident * page), size


def weight_files(folder: str) -> list[str] | str:
    """The folder's `*.safetensors` files, sorted, or why there are none to measure."""
    try:
        mode = os.stat(folder).st_mode
    except OSError:
        return "not a folder"
    if not stat.S_ISDIR(mode):
        return "not a folder"
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(SUFFIX))
    except OSError as exc:
        return f"cannot list it: {exc.strerror}"
    files = [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]
    return files or "no .safetensors files"


def _local(model: str, host: str) -> PageCache:
    if not sys.platform.startswith("linux"):
        return PageCache(model, host, reason=f"mincore is read on Linux only ({sys.platform})")
    found = weight_files(model)
    if isinstance(found, str):
        return PageCache(model, host, reason=f"{model} on {host}: {found}")
    files = []
    for path in found:
        try:
            resident, size = resident_bytes(path)
        except OSError as exc:
            return PageCache(model, host, reason=f"{path} on {host}: {exc.strerror or exc}")
        files.append(FileResidency(path, size, resident))
    return PageCache(model, host, tuple(files), tool="mincore")


# ---- any host ------------------------------------------------------------------------------------------------
async def read_page_cache(host: Host, model: str) -> PageCache:
    """How much of `model` (a folder of safetensors files on `host`) is in the host's page cache; never raises."""
    if getattr(host, "is_local", False):
        return await asyncio.to_thread(_local, model, host.name)
    try:
        result = await host.run(["sh", "-c", PAGE_CACHE_SCRIPT, "sh", model], timeout=60.0,
                                env={"MINCORE_PY": MINCORE_PY})
    except (HostError, OSError, TimeoutError) as exc:
        return PageCache(model, host.name, reason=f"{host.name}: {exc}")
    return parse_page_cache(model, host.name, result.returncode, result.stdout, result.stderr)


def parse_page_cache(model: str, host: str, returncode: int | None, stdout: str, stderr: str) -> PageCache:
    """PAGE_CACHE_SCRIPT's answer: a tool line, then `RESIDENT SIZE PATH` per file; anything else is a reason."""
    lines = stdout.splitlines()
    if returncode != 0 or not lines or not lines[0].startswith("tool "):
        said = lines[0] if lines else next(iter(stderr.strip().splitlines()[-1:]), "")
        what = said.strip()[:200] or f"the page-cache script exited {returncode}"
        hint = " (install util-linux for fincore, or python3)" if returncode == 5 else ""
        return PageCache(model, host, reason=f"{model} on {host}: {what}{hint}")
    tool = lines[0][len("tool "):].strip()
    files: list[FileResidency] = []
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split(maxsplit=2)
        if len(parts) != 3 or not parts[0].isascii() or not parts[0].isdigit() or not parts[1].isascii() \
                or not parts[1].isdigit():
            return PageCache(model, host, reason=f"{model} on {host}: {tool} printed line {number} that is not "
                             f"`RESIDENT SIZE PATH`: {line[:120]!r}")
        resident, size = int(parts[0]), int(parts[1])
        files.append(FileResidency(parts[2], size, min(resident, size)))
    if not files:
        return PageCache(model, host, reason=f"{model} on {host}: {tool} printed no file")
    return PageCache(model, host, tuple(files), tool=tool)


@dataclass(frozen=True)
class PrewarmProgress:
    """How far a prewarm is: bytes read of the total, the file being read, seconds so far."""

    done_bytes: int
    total_bytes: int
    path: str
    elapsed_s: float
    file_done: bool = False


async def prewarm(host: Host, cache: PageCache, progress: Callable[[PrewarmProgress], None]) -> float:
    """Read every file of `cache` (as read_page_cache found them) once, so the page cache holds them; seconds it
    took. Local: in a thread, 16 MiB at a time; SSH: `cat` per file over one exec. Raises HostError/OSError."""
    total = cache.total_bytes or 0
    started = time.monotonic()
    if getattr(host, "is_local", False):
        loop = asyncio.get_running_loop()

        def tell(update: PrewarmProgress) -> None:
            loop.call_soon_threadsafe(progress, update)

        await asyncio.to_thread(_read_local, cache.files, total, started, tell)
        return time.monotonic() - started
    sizes = {f.path: f.size for f in cache.files}
    done = 0
    async for line in host.stream_lines(["sh", "-c", PREWARM_SCRIPT, "sh", *sizes]):
        if line.startswith("\x00exit:"):
            code = line[len("\x00exit:"):].strip()
            if code != "0":
                raise HostError(f"{host.name}: reading the weight files stopped (exit code {code})")
        elif line.startswith("read "):
            path = line[len("read "):]
            done += sizes.get(path, 0)
            progress(PrewarmProgress(done, total, path, time.monotonic() - started, file_done=True))
    return time.monotonic() - started


def _read_local(files: tuple[FileResidency, ...], total: int, started: float,
                tell: Callable[[PrewarmProgress], None]) -> None:
    done = 0
    buffer = bytearray(READ_CHUNK)
    view = memoryview(buffer)
    last = 0.0
    for entry in files:
        with open(entry.path, "rb", buffering=0) as fh:
            while read := fh.readinto(view):
                done += read
                now = time.monotonic()
                if now - last >= 0.1:
                    last = now
                    tell(PrewarmProgress(done, total, entry.path, now - started))
        tell(PrewarmProgress(done, total, entry.path, time.monotonic() - started, file_done=True))
