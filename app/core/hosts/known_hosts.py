"""known_hosts files read as OpenSSH reads them: which entries name a host, in which file and on which line.

A host is looked up under one name, the one OpenSSH uses (`ssh_options.known_hosts_name`): no lookup by IP
address, no fallback from `[host]:port` to `host`. Missing or unreadable files and lines that cannot be
parsed are skipped, as OpenSSH skips them. `HostKeyCheck` answers asyncssh's question during the handshake
from the same entries, so the check of a connection and the trust command read the files the same way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

MARKERS = ("", "cert-authority", "revoked")
_PATTERN_CHARS = "*?|/!"  # a line with any of these in its host field is a pattern or a hashed name


@dataclass(frozen=True)
class KnownHostEntry:
    """One key that a known_hosts line lists for the host: where it is, its marker ("", "cert-authority",
    "revoked") and the key."""

    file: str
    line: int
    marker: str
    key: asyncssh.SSHKey

    @property
    def where(self) -> str:
        """`file:line`, as a person opens it in an editor."""
        return f"{self.file}:{self.line}"


def entries_for(files: Sequence[str], name: str) -> list[KnownHostEntry]:
    """Every entry of `files` whose host field matches `name` ("host" or "[host]:port"), in file order."""
    found: list[KnownHostEntry] = []
    for path in files:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except (OSError, ValueError):
            continue
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#") or not _may_name(line, name):
                continue
            try:
                keys, ca_keys, revoked = asyncssh.import_known_hosts(line).match(name, "", None)[:3]
            except (ValueError, TypeError):
                continue
            found += [KnownHostEntry(path, number, "", key) for key in keys]
            found += [KnownHostEntry(path, number, "cert-authority", key) for key in ca_keys]
            found += [KnownHostEntry(path, number, "revoked", key) for key in revoked]
    return found


def _may_name(line: str, name: str) -> bool:
    """A cheap first look: False only when the line certainly does not name `name` (no key is parsed)."""
    fields = line.split(None, 2)
    hosts = fields[1] if line.startswith("@") and len(fields) > 1 else fields[0]
    if any(char in hosts for char in _PATTERN_CHARS):
        return True
    return name in hosts.split(",")


class HostKeyCheck:
    """asyncssh's `known_hosts` callable: the keys `files` list for `name`, whatever host, address and port
    asyncssh passes (it would also look up the peer's IP address and retry without the port)."""

    def __init__(self, files: Sequence[str], name: str) -> None:
        self.files = tuple(files)
        self.name = name

    def __call__(
        self, host: str, addr: str, port: int | None
    ) -> tuple[list[asyncssh.SSHKey], list[asyncssh.SSHKey], list[asyncssh.SSHKey]]:
        entries = entries_for(self.files, self.name)
        return ([e.key for e in entries if e.marker == ""], [e.key for e in entries if e.marker == "cert-authority"],
                [e.key for e in entries if e.marker == "revoked"])


def append_line(path: str, line: str) -> None:
    """Append one known_hosts line; a new file is made 0600 in a folder made 0700 (as ssh makes ~/.ssh)."""
    target = Path(path)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(target, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        ends_open = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        handle.write(("\n" if ends_open else "").encode() + line.encode() + b"\n")
