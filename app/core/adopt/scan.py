"""The servers running on a host, read through its Host's /proc (one shell script); details.py adds the rest.

For each process whose command line names a server (command.classify; the script's grep only narrows the
candidates, the argv decides): pid, owner, start time, interpreter (/proc/PID/exe and the argv[0] that resolves
to it, so a venv's python stays the venv's), model, port (argv, else the socket it listens on: /proc/net/tcp*
inodes against /proc/PID/fd), GPUs and MiB (its process tree in nvidia-smi's compute-apps list), the environment
that matters (None when /proc/PID/environ cannot be read), and whether tunedash launched it (TUNEDASH_JOB, and
the job record holding that tag). Only a server's main process is listed: its children (schedulers, TP workers)
are folded into its GPU memory. Nothing is signalled.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.core.adopt.command import ParsedArgs, ServerCommand, classify, parse_server_args
from app.core.hosts.base import Host, HostError
from app.core.hosts.procfs import parse_stat_line
from app.core.server.jobs import TAG_ENV, JobRecord

# The environment a written profile keeps (prefixes), and what the listing needs besides.
PROFILE_ENV_PREFIXES = ("SGLANG_", "VLLM_", "CUDA_", "NCCL_", "HF_", "OMP_")
SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|KEY", re.IGNORECASE)
_ENV_GREP = "^(SGLANG_|VLLM_|CUDA_|NCCL_|HF_|OMP_|TUNEDASH_|PATH=|PYTHONPATH=)"
CANDIDATES = r"sglang|vllm"

# `sh -c SCRIPT sh REGEX ENVGREP [PID ...]`: a header line, then per candidate process (those whose cmdline
# matches REGEX, or the PIDs given) one block of lines: "P pid", "S stat line", "U uid user", "X exe",
# "W cwd", "L fd/1 target", "C base64(cmdline)", "E base64(filtered environ)" or "E -" (unreadable),
# "K socket inodes"; then "T" lines of /proc/net/tcp and tcp6. A process gone midway has a partial block.
SCAN_SCRIPT = r"""
regex=$1; envgrep=$2; shift 2
echo "H $(getconf CLK_TCK 2>/dev/null || echo 100) $(sed -n 's/^btime //p' /proc/stat) $(id -u)"
if [ $# -gt 0 ]; then
  pids="$*"
else
  pids=$(grep -l -a -E -- "$regex" /proc/[0-9]*/cmdline 2>/dev/null | sed -n 's,^/proc/\([0-9]*\)/cmdline$,\1,p')
fi
for pid in $pids; do
  d=/proc/$pid
  [ "$pid" = "$$" ] && continue
  stat=$(cat "$d/stat" 2>/dev/null) || continue
  echo "P $pid"
  echo "S $stat"
  echo "U $(stat -c '%u %U' "$d" 2>/dev/null)"
  echo "X $(readlink "$d/exe" 2>/dev/null)"
  echo "W $(readlink "$d/cwd" 2>/dev/null)"
  echo "L $(readlink "$d/fd/1" 2>/dev/null)"
  echo "C $(base64 -w0 < "$d/cmdline" 2>/dev/null)"
  if env=$(tr '\0' '\n' < "$d/environ" 2>/dev/null); then
    echo "E $(printf '%s\n' "$env" | grep -E -- "$envgrep" | base64 -w0)"
  else
    echo "E -"
  fi
  socks=$(for f in "$d"/fd/*; do readlink "$f"; done 2>/dev/null)
  echo "K $(printf '%s\n' "$socks" | sed -n 's/^socket:\[\([0-9]*\)\]$/\1/p' | tr '\n' ' ')"
done
cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | sed 's/^/T /'
"""


@dataclass(frozen=True)
class AdoptProof:
    """What the process was when adopt read it: a later signal must find the very same (issue 24 item 3 re-reads
    these right before it: takeover.py). start_time is field 22 of /proc/PID/stat, as in job records."""

    host: str
    pid: int
    start_time: str
    uid: int | None
    user: str
    argv: tuple[str, ...]
    exe: str
    read_at: float


@dataclass(frozen=True)
class GpuUse:
    """The GPUs a server's process tree holds memory on: {index: MiB}, or None and why it cannot be read."""

    mib: dict[int, int] | None
    reason: str = ""


@dataclass
class AdoptableServer:
    """One server's main process on a host, as `tunedash adopt` lists it."""

    host: str
    pid: int
    command: ServerCommand
    parsed: ParsedArgs
    proof: AdoptProof
    started_at: float | None  # time.time() of the process start (None when the boot time is unreadable)
    python: str  # the interpreter to launch it again with: argv[0] resolved when it is the exe, else the exe
    python_note: str
    environ: dict[str, str] | None  # the variables of interest; None: /proc/PID/environ unreadable
    port: int | None
    port_source: str  # "argv", "socket", "default" or ""
    gpus: GpuUse
    cuda_visible: str | None  # CUDA_VISIBLE_DEVICES as set (None: not set or unreadable)
    log_target: str  # what its stdout goes to (/proc/PID/fd/1): a file path, "pipe:[...]", "/dev/pts/3"
    mine: bool  # same user as tunedash on that host
    tunedash_tag: str = ""  # TUNEDASH_JOB of its environment
    record: JobRecord | None = None  # the record holding that tag
    record_path: str = ""
    version: str | None = None
    version_reason: str = ""
    shares_gpus_with: list[int] = field(default_factory=list)

    @property
    def user(self) -> str:
        return self.proof.user

    @property
    def launched_by_tunedash(self) -> bool:
        return bool(self.tunedash_tag)

    def not_adoptable(self) -> str:
        """Why adopting it (a takeover) is refused, or "" when it could be."""
        if not self.mine:
            return f"belongs to user {self.user}: tunedash never signals another user's process"
        if self.launched_by_tunedash:
            where = f"profile {self.record.profile}" if self.record else f"tag {self.tunedash_tag}, record not found"
            return f"launched by tunedash ({where}): `tunedash ui PROFILE` attaches to it"
        return ""

    def gpu_indices(self) -> list[int]:
        """The GPUs it uses: CUDA_VISIBLE_DEVICES when it names indices, else those holding its memory."""
        visible = visible_indices(self.cuda_visible)
        if visible is not None:
            return visible
        return sorted(self.gpus.mib) if self.gpus.mib else []


@dataclass
class _Raw:
    pid: int
    lines: dict[str, str] = field(default_factory=dict)


def visible_indices(value: str | None) -> list[int] | None:
    """CUDA_VISIBLE_DEVICES as GPU indices; None when unset, empty or not indices (UUIDs, MIG names)."""
    if not value:
        return None
    items = [item.strip() for item in value.split(",")]
    if not all(item.isdigit() for item in items):
        return None
    return [int(item) for item in items]


def _b64_text(value: str) -> str | None:
    try:
        return base64.b64decode(value, validate=True).decode("utf-8", "surrogateescape")
    except (binascii.Error, ValueError):
        return None


def _listening_inodes(tcp_lines: list[str]) -> dict[str, int]:
    """inode -> port for sockets in LISTEN state (/proc/net/tcp columns: local_address st ... inode)."""
    found: dict[str, int] = {}
    for line in tcp_lines:
        parts = line.split()
        if len(parts) < 10 or parts[0] == "sl" or parts[3] != "0A" or ":" not in parts[1]:
            continue
        try:
            found[parts[9]] = int(parts[1].rsplit(":", 1)[1], 16)
        except ValueError:
            continue
    return found


async def read_processes(host: Host, pids: Sequence[int] = (),
                         custom_commands: Sequence[tuple[str, Sequence[str]]] = (),
                         others: dict[int, tuple[str, ...]] | None = None) -> list[AdoptableServer]:
    """The servers on `host` (or among `pids`), main processes only, in pid order (module docstring). The
    command lines of the processes read that are not servers go into `others` (pid -> argv) when given."""
    regex = "|".join([CANDIDATES, *(re.escape(cmd[0].rsplit("/", 1)[-1]) for _n, cmd in custom_commands if cmd)])
    result = await host.run(["sh", "-c", SCAN_SCRIPT, "sh", regex, _ENV_GREP, *(str(int(p)) for p in pids)],
                            timeout=60.0)
    if result.returncode != 0 and not result.stdout:
        raise HostError(f"{host.name}: could not read its processes: {(result.stderr or '').strip()[-300:]}")
    header: list[str] = []
    raws: list[_Raw] = []
    tcp: list[str] = []
    for line in result.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "H":
            header = rest.split()
        elif kind == "P" and rest.isdigit():
            raws.append(_Raw(int(rest)))
        elif kind == "T":
            tcp.append(rest)
        elif raws and len(kind) == 1:
            raws[-1].lines[kind] = rest
    clk = int(header[0]) if len(header) > 0 and header[0].isdigit() else 100
    boot = int(header[1]) if len(header) > 1 and header[1].isdigit() else None
    my_uid = int(header[2]) if len(header) > 2 and header[2].isdigit() else None
    inodes = _listening_inodes(tcp)
    read_at = time.time()
    servers = []
    for raw in raws:
        server = _server(host, raw, custom_commands, clk, boot, my_uid, inodes, read_at)
        if server is not None:
            servers.append(server)
        elif others is not None:
            others[raw.pid] = _argv(_b64_text(raw.lines.get("C", "")) or "")
    return servers


def _server(host: Host, raw: _Raw, custom_commands: Sequence[tuple[str, Sequence[str]]], clk: int,
            boot: int | None, my_uid: int | None, inodes: dict[str, int], read_at: float) -> AdoptableServer | None:
    cmdline = _b64_text(raw.lines.get("C", ""))
    stat = parse_stat_line(raw.lines.get("S", ""))
    if not cmdline or stat is None or stat.state == "Z":
        return None
    argv = _argv(cmdline)
    command = classify(argv, custom_commands)
    if command is None:
        return None
    uid_text, _, user = raw.lines.get("U", "").partition(" ")
    uid = int(uid_text) if uid_text.isdigit() else None
    environ = _environ(raw.lines.get("E", "-"))
    exe = raw.lines.get("X", "")
    parsed = parse_server_args(command) if command.backend != "custom" else ParsedArgs()
    port, port_source = _port(command, parsed, raw.lines.get("K", "").split(), inodes)
    started = boot + int(stat.start_time) / clk if boot is not None and stat.start_time.isdigit() else None
    proof = AdoptProof(host.name, raw.pid, stat.start_time, uid, user or (uid_text or "?"), argv, exe, read_at)
    tag = (environ or {}).get(TAG_ENV, "")
    return AdoptableServer(
        host=host.name, pid=raw.pid, command=command, parsed=parsed, proof=proof, started_at=started,
        python=exe or command.interpreter, python_note="", environ=environ, port=port, port_source=port_source,
        gpus=GpuUse(None, "not read yet"), cuda_visible=(environ or {}).get("CUDA_VISIBLE_DEVICES"),
        log_target=raw.lines.get("L", ""), mine=uid is not None and uid == my_uid, tunedash_tag=tag,
        version_reason="not asked")


def _argv(cmdline: str) -> tuple[str, ...]:
    """/proc/PID/cmdline's NUL-separated items (a kernel thread's empty cmdline: no items)."""
    items = cmdline.split("\0")
    return tuple(items[:-1] if cmdline.endswith("\0") else items) if cmdline else ()


def _environ(line: str) -> dict[str, str] | None:
    if line == "-":
        return None
    text = _b64_text(line) if line else ""
    if text is None:
        return None
    env: dict[str, str] = {}
    for item in text.splitlines():
        name, sep, value = item.partition("=")
        if sep and name:
            env[name] = value
    return env


def _port(command: ServerCommand, parsed: ParsedArgs, sockets: list[str],
          inodes: dict[str, int]) -> tuple[int | None, str]:
    if command.backend == "custom":
        listening = sorted({inodes[i] for i in sockets if i in inodes})
        return (listening[0], "socket") if listening else (None, "")
    if any(word == "--port" or word.startswith("--port=") for word in command.args):
        return parsed.port, "argv"
    listening = sorted({inodes[i] for i in sockets if i in inodes})
    if parsed.port in listening or not listening:
        return parsed.port, "default"
    return listening[0], "socket"


async def still_same(host: Host, proof: AdoptProof) -> str:
    """"" when pid `proof.pid` is still the process adopt read (same start tick, same command line, same owner);
    else what changed. For the takeover's check before a signal (issue 24 item 3) and for --write."""
    others: dict[int, tuple[str, ...]] = {}
    found = await read_processes(host, [proof.pid], others=others)
    if proof.pid in others:
        return f"pid {proof.pid} on {host.name} has another command line now (it is not that server any more)"
    if not found:
        return f"pid {proof.pid} is gone from {host.name} (it exited)"
    now = found[0].proof
    if now.start_time != proof.start_time:
        return f"pid {proof.pid} on {host.name} is another process now (started at another time: the pid was reused)"
    if now.argv != proof.argv:
        return f"pid {proof.pid} on {host.name} has another command line now"
    if now.uid != proof.uid:
        return f"pid {proof.pid} on {host.name} belongs to another user now"
    return ""
