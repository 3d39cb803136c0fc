"""What the user's ~/.ssh/config says about one SSH target, read once with asyncssh's own config loading and
made safe: the one set of options that the host-key check and the connection both use.

HostName, Port, User, IdentityFile, ProxyJump, HostKeyAlias, UserKnownHostsFile, ServerAliveInterval and
ConnectTimeout mean what they mean to OpenSSH. Nothing in the config turns host-key checking off or lets the
host reach back: `UserKnownHostsFile none` falls back to OpenSSH's default file (asyncssh would check
nothing), StrictHostKeyChecking is not read, and agent forwarding, X11 forwarding and PTYs are always off.
Jump hosts are resolved here too, each with its own config and the same rules, so asyncssh never opens one
on its own terms (docs/architecture.md#remote-hosts).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncssh

from app.core.hosts.base import HostError
from app.core.hosts.known_hosts import HostKeyCheck

DEFAULT_PORT = 22
DEFAULT_KEEPALIVE_S = 15.0
DEFAULT_KEEPALIVE_COUNT = 3
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts",)
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts",)
MAX_JUMPS = 8
# Never taken from the config or from the options a caller passes.
ALWAYS = {"agent_forwarding": False, "request_pty": False, "x11_forwarding": False}

ALIAS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # as the profile schema accepts an ssh config alias
_HOST = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9._:%-]*")  # a host name or an IPv4/IPv6 address
_USER = re.compile(r"[^\s@:/]+")
HOW = "write ssh://user@host:port (user and port optional) or an ~/.ssh/config alias"


@dataclass(frozen=True)
class SshTarget:
    """Where to connect: `spec` as the person wrote it; host/port/user as given (None: from ~/.ssh/config)."""

    spec: str
    host: str
    port: int | None = None
    user: str | None = None

    @classmethod
    def parse(cls, spec: str) -> SshTarget:
        """`ssh://user@host:port` or an ssh config alias; anything else is a HostError naming the spec."""
        if not spec or any(char.isspace() or not char.isprintable() for char in spec):
            raise HostError(f"cannot read the SSH host {spec!r} (empty, or with spaces or control characters); {HOW}")
        if not spec.startswith("ssh://"):
            if not ALIAS.fullmatch(spec):
                raise HostError(f"cannot read the SSH host {spec!r}; {HOW}")
            return cls(spec, spec)
        try:
            parts = urlsplit(spec)
        except ValueError as exc:  # e.g. an unclosed [IPv6 address
            raise HostError(f"cannot read the SSH host {spec!r} ({exc}); {HOW}") from None
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise HostError(f"{spec}: the port must be a number 1-65535; {HOW}")
        if not parts.hostname or not _HOST.fullmatch(parts.hostname):
            raise HostError(f"{spec}: names no host that tunedash can reach; {HOW}")
        if parts.password is not None:
            raise HostError(f"{spec}: a password in the host is not supported; log in with a key (ssh-agent or "
                            "IdentityFile in ~/.ssh/config)")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise HostError(f"{spec}: a host has no path, query or fragment; {HOW}")
        user = unquote(parts.username) if parts.username else None
        if user is not None and not _USER.fullmatch(user):
            raise HostError(f"{spec}: cannot read the user name {user!r}; {HOW}")
        return cls(spec, parts.hostname, port, user)

    @classmethod
    def parse_jump(cls, text: str, of: str) -> SshTarget:
        """One ProxyJump entry, `[user@]host[:port]` or `ssh://...`, of the config of host `of`."""
        bad = HostError(f"{of}: cannot read the ProxyJump entry {text!r} in ~/.ssh/config; write "
                        "[user@]host[:port] (or ssh://user@host:port), comma-separated")
        if text.startswith("ssh://"):
            try:
                return cls.parse(text)
            except HostError:
                raise bad from None
        user, _, rest = text.rpartition("@")
        host, port_text = rest, ""
        if rest.startswith("["):
            host, _, tail = rest[1:].partition("]")
            port_text = tail[1:] if tail.startswith(":") else tail
        elif rest.count(":") == 1:
            host, port_text = rest.split(":")
        if port_text and not (port_text.isdigit() and 1 <= int(port_text) <= 65535):
            raise bad
        if not _HOST.fullmatch(host) or (user and not _USER.fullmatch(user)):
            raise bad
        return cls(text, host, int(port_text) if port_text else None, user or None)


@dataclass(frozen=True)
class SshSettings:
    """One target as the config resolves it: the asyncssh options for both the key check and the login."""

    target: SshTarget
    options: asyncssh.SSHClientConnectionOptions
    config_paths: tuple[str, ...]
    hostname: str  # HostName, as connected to
    port: int
    known_hosts_name: str  # HostKeyAlias, else the HostName ("[name]:port" off port 22): what OpenSSH looks up
    known_hosts_files: tuple[str, ...]  # UserKnownHostsFile (the first is where trust writes), then the global ones
    via: SshSettings | None = None  # the last jump host (ProxyJump), itself perhaps reached through others
    jump_for: str = ""  # the spec this host is a jump host for

    @property
    def label(self) -> str:
        """The host as messages name it."""
        return f"{self.target.spec} (the jump host to {self.jump_for})" if self.jump_for else self.target.spec

    @property
    def trust_file(self) -> str:
        """Where `tunedash trust` writes: the first UserKnownHostsFile (default ~/.ssh/known_hosts)."""
        return self.known_hosts_files[0]


def known_hosts_name(hostname: str, port: int, host_key_alias: str | None) -> str:
    """The name known_hosts is searched for, as OpenSSH does: HostKeyAlias as written, else the HostName in
    lower case, as `[name]:port` when the port is not 22."""
    if host_key_alias:
        return host_key_alias
    name = hostname.lower()
    return name if port == DEFAULT_PORT else f"[{name}]:{port}"


def settings_for(target: SshTarget, overrides: Mapping[str, Any] | None = None) -> SshSettings:
    """Read the config for `target` (and its jump hosts): the options every connection to it uses.

    `overrides` are asyncssh option values that win over the config (tests pin `config`, `known_hosts`
    files and `client_keys` there); they cannot turn host-key checking off either. Reads files: call it in a
    thread from async code.
    """
    return _settings(target, dict(overrides or {}), None, "", 0)


def _settings(target: SshTarget, overrides: dict[str, Any], jumps: str | None, jump_for: str,
              depth: int) -> SshSettings:
    paths = _config_paths(overrides.get("config", ()))
    given = {key: value for key, value in overrides.items() if key not in ("config", "known_hosts", *ALWAYS)}
    base: dict[str, Any] = {"config": list(paths), "host": target.host, **given, **ALWAYS, "tunnel": None}
    if target.port is not None:
        base["port"] = target.port
    if target.user is not None:
        base["username"] = target.user
    where = jump_for or target.spec
    first = _options(where, base, client_keys=None, known_hosts=None)  # the config's values; no keys loaded
    config = first.config
    port = int(first.port or DEFAULT_PORT)
    name = known_hosts_name(first.host, port, first.host_key_alias)
    files = _known_hosts_files(target, overrides, config)
    extra: dict[str, Any] = {"known_hosts": HostKeyCheck(files, name)}
    if not first.keepalive_interval and "keepalive_interval" not in overrides:
        extra["keepalive_interval"] = DEFAULT_KEEPALIVE_S
        extra["keepalive_count_max"] = overrides.get("keepalive_count_max", DEFAULT_KEEPALIVE_COUNT)
    if first.connect_timeout is None and "connect_timeout" not in overrides:
        extra["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT_S
    options = _options(where, base, **extra)
    proxy_jump = config.get("ProxyJump") if jumps is None else jumps
    via = None
    if proxy_jump:
        hops = [hop.strip() for hop in str(proxy_jump).split(",") if hop.strip()]
        if depth + len(hops) > MAX_JUMPS:
            raise HostError(f"{where}: more than {MAX_JUMPS} jump hosts (does ProxyJump in ~/.ssh/config loop?)")
        last = SshTarget.parse_jump(hops[-1], where)
        via = _settings(last, overrides, ",".join(hops[:-1]) if len(hops) > 1 else None, where, depth + 1)
    return SshSettings(target, options, paths, first.host, port, name, files, via, jump_for)


def _options(where: str, base: dict[str, Any], **extra: Any) -> asyncssh.SSHClientConnectionOptions:
    try:
        return asyncssh.SSHClientConnectionOptions(**{**base, **extra})
    except (ValueError, OSError, TypeError, asyncssh.Error) as exc:
        raise HostError(f"{where}: cannot use the SSH settings ({exc}); check ~/.ssh/config") from None


def _config_paths(given: Any) -> tuple[str, ...]:
    """The config files to read: () means ~/.ssh/config when it is readable, None means none."""
    if given is None:
        return ()
    if given == ():
        default = os.path.expanduser(os.path.join("~", ".ssh", "config"))
        return (default,) if os.access(default, os.R_OK) else ()
    if isinstance(given, str | os.PathLike):
        return (os.fspath(given),)
    return tuple(os.fspath(path) for path in given)


def _known_hosts_files(target: SshTarget, overrides: Mapping[str, Any], config: Any) -> tuple[str, ...]:
    """UserKnownHostsFile then GlobalKnownHostsFile, `~` expanded; `none` (or no entry) is OpenSSH's default."""
    if "known_hosts" in overrides:
        given = overrides["known_hosts"]
        if isinstance(given, str | os.PathLike):
            given = [given]
        if not given or not all(isinstance(item, str | os.PathLike) for item in given):
            raise HostError(f"{target.spec}: host-key checking cannot be turned off in tunedash (known_hosts must "
                            "name files)")
        return tuple(os.path.expanduser(os.fspath(item)) for item in given)
    user = config.get("UserKnownHostsFile") or DEFAULT_USER_KNOWN_HOSTS
    global_files = config.get("GlobalKnownHostsFile") or DEFAULT_GLOBAL_KNOWN_HOSTS
    return tuple(os.path.expanduser(str(path)) for path in (*user, *global_files))
