"""SGLang-format log lines (`[2026-11-30 12:50:10 TP0] msg`) written whole to stdout/stderr of this process."""

from __future__ import annotations

import os
import time


def stamp(now: float | None = None) -> str:
    now = time.time() if now is None else now
    text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    if os.environ.get("SGLANG_LOG_MS"):
        text += f".{int(now * 1000) % 1000:03d}"
    return text


def log(msg: str, prefix: str = "", fd: int = 1) -> None:
    """One log line; `prefix` is the rank part (" TP0") or "" for the main process and TP=1 schedulers."""
    raw = f"[{stamp()}{prefix}] {msg}\n".encode()
    try:
        os.write(fd, raw)
    except OSError:
        pass


def raw(text: str, fd: int = 2) -> None:
    """Unprefixed text (tracebacks, tqdm bars)."""
    try:
        os.write(fd, text.encode())
    except OSError:
        pass
