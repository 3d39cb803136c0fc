"""SSH targets and host-key trust: parse `ssh://user@host:port` or an alias, read a server's key, known_hosts.

Host keys are always verified (docs/architecture.md#remote-hosts). A key that known_hosts does not know is "unknown":
the CLI refuses and prints its fingerprint and `tunedash trust HOST`; the dashboard asks. A key that differs
from the one known_hosts holds for that host is "changed" and is always refused.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncssh

from app.core.hosts.base import HostError

DEFAULT_KEEPALIVE_S = 15.0
DEFAULT_KEEPALIVE_COUNT = 3
DEFAULT_CONNECT_TIMEOUT_S = 10.0


class HostKeyUnknown(HostError):
    """The server's key is not in known_hosts; `request` says which key and where it would go."""

    def __init__(self, message: str, request: TrustRequest) -> None:
        super().__init__(message)
        self.request = request


class HostKeyChanged(HostError):
    """The server's key differs from the one known_hosts holds. Never accepted."""


@dataclass(frozen=True)
class SshTarget:
    """Where to connect: `spec` as the profile wrote it; host/port/user as given (None: from ~/.ssh/config)."""

    spec: str
    host: str
    port: int | None = None
    user: str | None = None

    @classmethod
    def parse(cls, spec: str) -> SshTarget:
        if spec.startswith("ssh://"):
            parts = urlsplit(spec)
            if not parts.hostname:
                raise HostError(f"cannot read the SSH host {spec!r}; write ssh://user@host:port (user, port optional)")
            return cls(spec, parts.hostname, parts.port, unquote(parts.username) if parts.username else None)
        return cls(spec, spec)  # an alias of ~/.ssh/config (Hostname, User, Port, IdentityFile, ProxyJump)


@dataclass(frozen=True)
class TrustRequest:
    """A server key to show a person: fingerprint, the known_hosts line that would trust it, and where."""

    spec: str
    host: str  # as known_hosts names it: "[addr]:port", or addr for port 22
    fingerprint: str
    known_hosts_line: str
    known_hosts_file: str
    status: str  # "unknown" | "changed" | "trusted"


def connect_options(target: SshTarget, overrides: dict[str, Any]) -> dict[str, Any]:
    """asyncssh.connect keyword arguments: the config's values, our defaults where it has none, overrides.

    Defaults: keepalive every 15 s, 3 misses, a 10 s connect timeout (~/.ssh/config's ServerAliveInterval,
    ServerAliveCountMax and ConnectTimeout win). Refuses a configuration that turns host-key checking off.
    """
    kwargs: dict[str, Any] = {}
    if target.port is not None:
        kwargs["port"] = target.port
    if target.user is not None:
        kwargs["username"] = target.user
    kwargs.update(overrides)
    if "known_hosts" in kwargs and kwargs["known_hosts"] is None:
        raise HostError(f"{target.spec}: host-key checking cannot be turned off in tunedash")
    try:
        probe = asyncssh.SSHClientConnectionOptions(host=target.host, **kwargs)
    except (ValueError, OSError, asyncssh.Error) as exc:
        raise HostError(f"{target.spec}: cannot use the SSH settings ({exc}); check ~/.ssh/config") from exc
    if probe.known_hosts is None:
        raise HostError(
            f"{target.spec}: ~/.ssh/config sets `UserKnownHostsFile none` for this host, which turns host-key "
            "checking off; tunedash always verifies host keys. Remove that line (or point it at a file)"
        )
    if not probe.keepalive_interval and "keepalive_interval" not in overrides:
        kwargs["keepalive_interval"] = DEFAULT_KEEPALIVE_S
        kwargs.setdefault("keepalive_count_max", DEFAULT_KEEPALIVE_COUNT)
    if probe.connect_timeout is None and "connect_timeout" not in overrides:
        kwargs["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT_S
    return kwargs


def known_hosts_files(target: SshTarget, kwargs: dict[str, Any]) -> list[str]:
    """The known_hosts files asyncssh checks for this target (the first is where `trust` writes)."""
    options = asyncssh.SSHClientConnectionOptions(host=target.host, **kwargs)
    given = options.known_hosts
    if isinstance(given, str | os.PathLike):
        return [os.fspath(given)]
    if isinstance(given, list | tuple) and given and all(isinstance(x, str | os.PathLike) for x in given):
        return [os.fspath(x) for x in given]
    return [str(Path("~", ".ssh", "known_hosts").expanduser())]


def _pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


async def inspect_host_key(target: SshTarget, kwargs: dict[str, Any]) -> TrustRequest:
    """Read the server's key (a handshake, no login) and say whether known_hosts trusts, lacks or contradicts it."""
    options = asyncssh.SSHClientConnectionOptions(host=target.host, **kwargs)
    host = options.host_key_alias or options.host
    port = int(options.port or 22)
    passthrough = {key: kwargs[key] for key in ("config",) if key in kwargs}
    timeout = float(kwargs.get("connect_timeout") or DEFAULT_CONNECT_TIMEOUT_S)
    try:
        tunnel: Any = options.tunnel or ()
        key = await asyncio.wait_for(
            asyncssh.get_server_host_key(options.host, port, tunnel=tunnel, **passthrough), timeout
        )
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        raise HostError(f"{target.spec}: cannot reach {host}:{port} to read its host key ({exc})") from exc
    if key is None:
        raise HostError(f"{target.spec}: {host}:{port} presented no host key")
    line = f"{_pattern(host, port)} {key.export_public_key().decode().strip()}"
    files = known_hosts_files(target, kwargs)
    status = key_status(files, host, port, key.public_data)
    return TrustRequest(target.spec, _pattern(host, port), key.get_fingerprint("sha256"), line, files[0], status)


def key_status(files: list[str], host: str, port: int, public_data: bytes) -> str:
    """"trusted" when a file lists this key for the host, "changed" when they list only others, else "unknown"."""
    status = "unknown"
    for path in files:
        if not Path(path).exists():
            continue
        try:
            known = asyncssh.read_known_hosts(path)
        except (ValueError, OSError):
            continue
        host_keys = known.match(host, "", port)[0]
        if any(k.public_data == public_data for k in host_keys):
            return "trusted"
        if host_keys:
            status = "changed"
    return status


def add_known_host(request: TrustRequest) -> None:
    """Append the request's line to its known_hosts file (creating ~/.ssh 0700, the file 0600)."""
    if request.status == "changed":
        raise HostKeyChanged(changed_message(request))
    path = Path(request.known_hosts_file)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    existing = path.read_text() if path.exists() else ""
    with path.open("a") as handle:
        if existing and not existing.endswith("\n"):
            handle.write("\n")
        handle.write(request.known_hosts_line + "\n")
    path.chmod(0o600)


def unknown_message(request: TrustRequest) -> str:
    return (
        f"{request.spec}: the host key of {request.host} is not in {request.known_hosts_file}; refusing to "
        f"connect. Its fingerprint is {request.fingerprint}. Compare it with the host's own key (on the host: "
        f"`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then run `tunedash trust {request.spec}`"
    )


def changed_message(request: TrustRequest) -> str:
    return (
        f"{request.spec}: the host key of {request.host} has CHANGED (it now presents {request.fingerprint}; "
        f"{request.known_hosts_file} holds a different key). Someone may be intercepting the connection, or "
        "the host was reinstalled; tunedash refuses to connect. If you know the host was reinstalled, remove "
        f"the old key with `ssh-keygen -f {request.known_hosts_file} -R '{request.host}'` and run "
        f"`tunedash trust {request.spec}`"
    )
