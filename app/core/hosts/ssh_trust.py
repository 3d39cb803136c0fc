"""Host-key trust: every SSH connection is opened here, and only to a host whose key known_hosts holds.

Host keys are always verified (docs/architecture.md#remote-hosts), with the options `ssh_options` reads from
the user's ssh config, the same for the check and the login. A key that known_hosts does not list for the
name OpenSSH looks up is "unknown": the CLI refuses and prints its fingerprint and `tunedash trust HOST`; the
dashboard asks. A key that differs from the one known_hosts holds is "changed" (refused, naming the file and
line); a key marked @revoked is refused too. Jump hosts (ProxyJump) are checked the same way, each before
the next. A login the host refuses is a `LoginRefused`: retrying cannot help, so callers stop.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import asyncssh

from app.core.hosts.base import HostError
from app.core.hosts.known_hosts import append_line, entries_for
from app.core.hosts.ssh_options import SshSettings


class HostKeyUnknown(HostError):
    """The server's key is not in known_hosts; `request` says which key and where it would go."""

    title = "Unknown host key"

    def __init__(self, message: str, request: TrustRequest) -> None:
        super().__init__(message)
        self.request = request


class HostKeyChanged(HostError):
    """The server's key differs from the one known_hosts holds, or known_hosts revokes it. Never accepted."""

    title = "Host key changed"


class LoginRefused(HostError):
    """The host refused the login (user, key): retrying would not help, and may lock the account."""

    title = "Login refused"


@dataclass(frozen=True)
class TrustRequest:
    """A server key to show a person: fingerprint, the known_hosts line that would trust it, and where."""

    spec: str  # the host as `tunedash trust` takes it
    host: str  # the name known_hosts is searched for: "[addr]:port", addr for port 22, or the HostKeyAlias
    fingerprint: str
    known_hosts_line: str
    known_hosts_file: str
    status: str  # "unknown" | "changed" | "revoked" | "trusted"
    conflicts: tuple[str, ...] = ()  # "file:line" of the entries that hold another key (or revoke this one)
    jump_for: str = ""  # the host this one is the jump host to, when it is one

    @property
    def label(self) -> str:
        return f"{self.spec} (the jump host to {self.jump_for})" if self.jump_for else self.spec


async def open_verified(settings: SshSettings) -> asyncssh.SSHClientConnection:
    """A logged-in connection to the settings' host, through its jump hosts, each key verified first.

    Raises HostKeyUnknown, HostKeyChanged, LoginRefused, or HostError (unreachable, timed out)."""
    tunnel = await open_verified(settings.via) if settings.via is not None else None
    try:
        conn = await asyncssh.connect(settings.target.host, settings.port, tunnel=tunnel,
                                      config=list(settings.config_paths), options=settings.options)
    except asyncssh.HostKeyNotVerifiable:
        try:
            request = await inspect_host_key(settings, tunnel)
        finally:
            _close(tunnel)
        raise refusal(request) from None
    except asyncssh.PermissionDenied as exc:
        _close(tunnel)
        raise LoginRefused(
            f"{settings.label}: login refused ({exc.reason}); check the user and IdentityFile in ~/.ssh/config "
            "or load your key into ssh-agent"
        ) from None
    except (asyncssh.Error, OSError, TimeoutError) as exc:
        _close(tunnel)
        raise HostError(f"{settings.label}: cannot connect ({type(exc).__name__}: {exc})") from None
    except BaseException:
        _close(tunnel)
        raise
    if tunnel is not None:
        conn.set_tunnel(tunnel)  # closing the connection closes its jump hosts
    return conn


def _close(conn: asyncssh.SSHClientConnection | None) -> None:
    if conn is not None:
        # Only on a failed or cancelled connect: the error being raised is what the user sees, and a half-open
        # connection that fails to close has nothing left to lose.
        with contextlib.suppress(Exception):
            conn.close()


async def inspect_host_key(
    settings: SshSettings, tunnel: asyncssh.SSHClientConnection | None = None
) -> TrustRequest:
    """Read the server's key (a handshake, no login; jump hosts are logged into, verified) and say whether
    known_hosts trusts, lacks, contradicts or revokes it."""
    own_tunnel = tunnel is None and settings.via is not None
    if own_tunnel and settings.via is not None:
        tunnel = await open_verified(settings.via)
    where = f"{settings.hostname}:{settings.port}"
    try:
        key = await asyncssh.get_server_host_key(settings.target.host, settings.port, tunnel=tunnel,
                                                 config=list(settings.config_paths), options=settings.options)
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        raise HostError(f"{settings.label}: cannot reach {where} to read its host key ({exc})") from None
    finally:
        if own_tunnel:
            _close(tunnel)
    if key is None:
        raise HostError(f"{settings.label}: {where} presented no host key")
    name = settings.known_hosts_name
    status, conflicts = key_status(settings, key)
    line = f"{name} {key.export_public_key().decode().strip()}"
    return TrustRequest(settings.target.spec, name, key.get_fingerprint("sha256"), line, settings.trust_file,
                        status, conflicts, settings.jump_for)


def key_status(settings: SshSettings, key: asyncssh.SSHKey) -> tuple[str, tuple[str, ...]]:
    """("trusted" | "changed" | "revoked" | "unknown", where the contradicting or revoking entries are)."""
    entries = entries_for(settings.known_hosts_files, settings.known_hosts_name)
    revoked = [e.where for e in entries if e.marker == "revoked" and e.key.public_data == key.public_data]
    if revoked:
        return "revoked", tuple(revoked)
    plain = [e for e in entries if e.marker == ""]
    if any(e.key.public_data == key.public_data for e in plain):
        return "trusted", ()
    if plain:
        return "changed", tuple(e.where for e in plain)
    return "unknown", ()


def refusal(request: TrustRequest) -> HostError:
    """The error for a key that was not verified, in words that say what to do."""
    if request.status == "unknown":
        return HostKeyUnknown(unknown_message(request), request)
    if request.status in ("changed", "revoked"):
        return HostKeyChanged(changed_message(request))
    return HostError(f"{request.label}: the host key of {request.host} is in {request.known_hosts_file} but could "
                     "not be verified (a certificate or an algorithm it does not offer?)")


def add_known_host(request: TrustRequest) -> None:
    """Append the request's line to its known_hosts file (a new file is 0600 in a folder made 0700)."""
    if request.status in ("changed", "revoked"):
        raise HostKeyChanged(changed_message(request))
    try:
        append_line(request.known_hosts_file, request.known_hosts_line)
    except OSError as exc:
        raise HostError(f"{request.label}: cannot add the host key to {request.known_hosts_file} ({exc})") from None


def unknown_message(request: TrustRequest) -> str:
    return (
        f"{request.label}: the host key of {request.host} is not in {request.known_hosts_file}; refusing to "
        f"connect. Its fingerprint is {request.fingerprint}. Compare it with the host's own key (on the host: "
        f"`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then run `tunedash trust {request.spec}`"
    )


def changed_message(request: TrustRequest) -> str:
    where = ", ".join(request.conflicts) or request.known_hosts_file
    file = request.conflicts[0].rsplit(":", 1)[0] if request.conflicts else request.known_hosts_file
    if request.status == "revoked":
        return (f"{request.label}: the host key of {request.host} ({request.fingerprint}) is marked @revoked in "
                f"{where}; tunedash refuses to connect")
    return (
        f"{request.label}: the host key of {request.host} has CHANGED (it now presents {request.fingerprint}; "
        f"{where} holds a different key). Someone may be intercepting the connection, or the host was "
        f"reinstalled; tunedash refuses to connect. If you know the host was reinstalled, remove the old key "
        f"with `ssh-keygen -f {file} -R '{request.host}'` and run `tunedash trust {request.spec}`"
    )
