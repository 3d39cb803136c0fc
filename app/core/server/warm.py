"""Warm mode: the backend's weight cache daemon as a job of tunedash's own, and what it changes for the server.

A profile with `warm = true` (docs/architecture.md#warm-relaunch-the-weight-cache) runs the daemon beside its
server:
- the daemon's command line (`daemon_argv`): SGLang `python -m sglang.srt.weight_cache.daemon <the server's
  flags>` (the simulated host: `python -m app.sim.weight_cache`), vLLM `python -m vllm.entrypoints.cli.main
  preload --model M <flags>`; the server's (`client_argv`): its own plus `--weight-cache-mode client` (SGLang) or
  `--load-format ipc_cache` (vLLM);
- its job: a record of its own (`daemon_profile`: the profile's name + WEIGHT_CACHE_SUFFIX, same file, so the
  record sits beside the server's), written before the spawn with a fresh tag, the tag in its environment, proven
  and signalled by app.core.server.jobs exactly as the server is (PID reuse, tag, boot id, group leader);
- its readiness: the launcher's own line after it found every ready file (SGLang `All N weight cache daemons on
  node 0 are ready`, vLLM `===== Weight cache daemon READY`), read from its log; a daemon group that dies first is
  a failed start with its last lines;
- `key_change`: the cache key fields (app.core.flags.weight_cache) two profiles differ in; a relaunch that keeps
  them keeps the daemon, one that changes them restarts it first and says which field changed;
- `warm_share`: a free check's verdict in which only the daemon's pids hold memory, and the rest of each GPU is at
  its idle baseline: the state is WARM ("engine gone; 25.1 GiB per GPU held by the weight cache, pids ...").
`warm_refusal` says why a profile cannot run warm on the server discovery found.

A custom profile (backend = "custom") names its own daemon in a [warm] table (app.core.profiles.types.CustomDaemon):
its argv is the table's `daemon` with the command's placeholders filled, the server's is the profile's command plus
`client_args`; it is ready when `ready_regex` matches a line of its log and/or `ready_file` exists and was written
after the spawn (a file left by an earlier daemon does not count); its cache key is that rendered argv, so a relaunch
keeps the daemon unless the daemon's own command changes. The job (record, tag, proofs, WARM) is the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from app.core.data import EventLevel, FlagValue
from app.core.errors import Reason
from app.core.flags.discovery import IPC_CACHE_FORMAT, ServerFlags
from app.core.flags.values import CUSTOM
from app.core.flags.weight_cache import changed_key_fields
from app.core.hosts.base import Host, HostError
from app.core.profiles.render import launch_argv, launch_env, substitute
from app.core.profiles.types import CustomDaemon, Profile, ProfileError
from app.core.server import jobs
from app.core.server.preflight import LaunchRefused, claim_launch

WEIGHT_CACHE_SUFFIX = "+weight-cache"
SGLANG_DAEMON_MODULE = "sglang.srt.weight_cache.daemon"
SIM_SERVER_MODULE, SIM_DAEMON_MODULE = "app.sim.sglang", "app.sim.weight_cache"
VLLM_CLI_MODULE = "vllm.entrypoints.cli.main"
SGLANG_READY = "weight cache daemons on node"  # `All N weight cache daemons on node R are ready (...)`
VLLM_READY = "===== Weight cache daemon READY"
READY_POLL_S = 0.1
DAEMON_GRACE_S = 10.0
MODEL_FLAG = {"sglang": "model-path", "vllm": "model"}
CUSTOM_KEY = "daemon-command"  # a custom daemon's cache key: its rendered argv (module docstring)


class WeightCacheFailed(LaunchRefused):
    """The daemon did not start or did not become ready; the message has its last log lines."""


# ---------------------------------------------------------------------------------------------- pure rules


def daemon_profile(profile: Profile) -> Profile:
    """The profile under which the daemon's record lives: the server's, named with WEIGHT_CACHE_SUFFIX."""
    return replace(profile, name=profile.name + WEIGHT_CACHE_SUFFIX, warm=False)


def daemon_argv(profile: Profile) -> list[str]:
    """The weight cache daemon's command line for `profile` (module docstring)."""
    if profile.backend == CUSTOM:
        return [substitute(item, profile) for item in _custom_daemon(profile).command]
    server = launch_argv(replace(profile, script=(), warm=False))
    flags = server[3:]  # after python -m MODULE
    if profile.backend == "vllm":  # `vllm preload` takes the engine's flags, not the HTTP server's --port
        at = flags.index("--port")
        return [profile.python, "-m", VLLM_CLI_MODULE, "preload", *flags[:at], *flags[at + 2:]]
    module = SIM_DAEMON_MODULE if profile.module == SIM_SERVER_MODULE else SGLANG_DAEMON_MODULE
    return [profile.python, "-m", module, *flags]


def client_argv(profile: Profile) -> list[str]:
    """The server's command line as the daemon's client."""
    if profile.backend == CUSTOM:
        return [*launch_argv(profile), *(substitute(item, profile) for item in _custom_daemon(profile).client_args)]
    if profile.backend == "vllm":  # ipc_cache replaces the profile's own load format (the daemon keeps that one)
        flags = {k: v for k, v in profile.flags.items() if k != "load-format"}
        return [*launch_argv(replace(profile, flags=flags)), "--load-format", "ipc_cache"]
    return [*launch_argv(profile), "--weight-cache-mode", "client"]


def key_flags(profile: Profile) -> dict[str, FlagValue]:
    """The flags the cache key is read from: the profile's flags with its model under the model flag (custom: the
    daemon's rendered argv under CUSTOM_KEY)."""
    if profile.backend == CUSTOM:
        return {CUSTOM_KEY: shlex.join(daemon_argv(profile))}
    return {**profile.flags, MODEL_FLAG.get(profile.backend, "model"): profile.model}


def key_change(backend: str, old: Mapping[str, FlagValue], new: Mapping[str, FlagValue]) -> tuple[str, ...]:
    """The cache key's fields the daemon's flags (`old`, from its record) and the next server's differ in."""
    if backend == CUSTOM:
        return ("the daemon's command",) if old.get(CUSTOM_KEY) != new.get(CUSTOM_KEY) else ()
    return changed_key_fields(backend, old, new)


def warm_refusal(profile: Profile, found: ServerFlags | None) -> str:
    """Why `profile` cannot run warm on the server discovery found; "" when it can (or nothing is known yet)."""
    if profile.backend == CUSTOM:
        return "" if profile.daemon is not None else (f"{profile.source}: warm: a custom profile names its daemon "
                                                      "in a [warm] table (daemon = [...], ready_regex or ready_file)")
    if profile.backend not in MODEL_FLAG:
        return f"{profile.source}: warm: the {profile.backend} backend has no weight cache daemon"
    if found is None or not found.known:
        return ""
    name = found.describe()
    if profile.backend == "sglang":
        if "weight-cache-mode" not in (found.flags or ()):
            return (f"{profile.source}: warm: {name} has no weight cache (--weight-cache-mode arrived in SGLang "
                    "0.5.23); remove warm or install 0.5.23+")
        if profile.flags.get("speculative-algorithm") is not None:
            return (f"{profile.source}: warm: {name} refuses --weight-cache-mode with --speculative-algorithm (its "
                    "daemon does not export the draft model's weights); remove speculative-algorithm or warm")
        return ""
    if IPC_CACHE_FORMAT not in (found.flags or ()):
        return (f"{profile.source}: warm: {name} has no ipc_cache load format (`vllm preload` arrived in vLLM 0.32); "
                "remove warm or install 0.32+ (`tunedash flags PROFILE --refresh` asks the server again)")
    return ""


def _custom_daemon(profile: Profile) -> CustomDaemon:
    if profile.daemon is None:
        raise ProfileError(f"{profile.source}: warm: a custom profile names its daemon in a [warm] table "
                           "(daemon = [...], ready_regex or ready_file)")
    return profile.daemon


def custom_ready(daemon: CustomDaemon, log_text: str, file_age_s: float | None, since_spawn_s: float) -> bool:
    """Whether a custom daemon is ready: its ready_regex on a line of its log, and its ready_file (its age on the
    host, None when absent) written after the spawn, each where the profile asks for it."""
    if daemon.ready_regex and not any(re.search(daemon.ready_regex, line) for line in log_text.splitlines()):
        return False
    return not daemon.ready_file or (file_age_s is not None and file_age_s < since_spawn_s)


# ---------------------------------------------------------------------------------------------- the daemon job


class WeightCacheJob:
    """The weight cache daemon of one profile on one host: find, start, wait ready, stop (module docstring)."""

    def __init__(self, host: Host, profile: Profile, say: Callable[[str, EventLevel], None]) -> None:
        self.host = host
        self.profile = profile
        self.say = say

    @property
    def job_profile(self) -> Profile:
        return daemon_profile(self.profile)

    async def current(self) -> jobs.JobRecord | None:
        """The live daemon's record (proven ours: jobs.check_job), else None."""
        record = await jobs.load_job(self.host, self.job_profile)
        if record is None or record.pid is None:
            return None
        check = await jobs.check_job(self.host, record)
        return record if check.members else None

    async def refusal(self) -> str:
        """Why a daemon record that names a live process is not ours (jobs.check_job's words); "" otherwise."""
        record = await jobs.load_job(self.host, self.job_profile)
        if record is None or record.pid is None:
            return ""
        check = await jobs.check_job(self.host, record)
        return "" if check.members else f"weight cache daemon record: {check.refusal}" if check.refusal else ""

    async def pids(self, record: jobs.JobRecord | None = None) -> set[int]:
        record = record or await self.current()
        if record is None:
            return set()
        return {p.pid for p in await jobs.job_members(self.host, record)}

    async def stop_if_stale(self, profile: Profile) -> tuple[str, ...]:
        """Stop the running daemon when `profile` changes its cache key; the fields that changed (() if none)."""
        self.profile = profile
        record = await self.current()
        if record is None:
            return ()
        changed = key_change(profile.backend, record.flags, key_flags(profile))
        if changed:
            self.say(f"the weight cache key changes ({', '.join(changed)}): restarting the weight cache daemon",
                     "info")
            await self.stop(record)
        return changed

    async def ensure(self, profile: Profile, timeout_s: float,
                     on_start: Callable[[], None] | None = None) -> jobs.JobRecord:
        """A ready daemon for `profile`: the running one (its key matches: see stop_if_stale), else started
        (`on_start` is called right before: the run's "daemon" phase begins, app.core.server.progress)."""
        self.profile = profile
        record = await self.current()
        if record is not None and not key_change(profile.backend, record.flags, key_flags(profile)):
            return record
        if record is not None:
            await self.stop(record)
        if on_start is not None:
            on_start()
        return await self.start(timeout_s)

    async def start(self, timeout_s: float) -> jobs.JobRecord:
        profile = self.profile
        job_profile = self.job_profile
        argv = daemon_argv(profile)
        log_path = jobs.log_path_for(self.host, job_profile)
        record = jobs.JobRecord(
            profile=job_profile.name, host=self.host.name, backend=profile.backend, model=profile.model,
            port=0, argv=list(argv), flags=key_flags(profile), pid=None, pgid=None, start_time="",
            log_path=log_path, launched_by=jobs.who_am_i(), launched_at=time.time(), gpus=list(profile.gpus),
            profile_file=jobs.profile_file_of(job_profile),
        )
        await claim_launch(self.host, job_profile, record)  # the record (its tag, no pid) before the spawn
        try:
            spawned = await self.host.spawn_detached(argv, log_path=log_path,
                                                     env={**launch_env(profile), **jobs.tag_env(record)})
        except HostError as exc:
            record.outcome = "killed"
            with contextlib.suppress(HostError, jobs.StaleRecord):
                await jobs.save_job(self.host, record)
            raise WeightCacheFailed(f"the weight cache daemon of {profile.name} did not start: {exc}",
                                    Reason.START_FAILED) from None
        jobs.fill_spawned(record, spawned)
        await jobs.save_job(self.host, record)
        self.say(f"weight cache daemon started: pid {spawned.pid} (group {spawned.pgid}), log {log_path}", "info")
        await self.wait_ready(record, timeout_s)
        record.outcome = "ready"
        record.ready_at = time.time()
        await jobs.save_job(self.host, record)
        return record

    async def wait_ready(self, record: jobs.JobRecord, timeout_s: float) -> None:
        """Until the launcher's ready line is in its log; WeightCacheFailed when the group dies or time runs out."""
        marker = VLLM_READY if record.backend == "vllm" else SGLANG_READY
        t0 = time.monotonic()
        spawned = t0 - max(0.0, time.time() - record.launched_at)  # the record was written right before the spawn
        while True:
            text = await self._log_tail(record)
            if await self._ready(marker, text, time.monotonic() - spawned):
                self.say(f"weight cache daemon ready after {time.monotonic() - t0:.1f} s", "info")
                return
            if not await jobs.job_alive(self.host, record):
                record.outcome = "crashed"
                with contextlib.suppress(HostError, jobs.StaleRecord):
                    await jobs.save_job(self.host, record)
                last = "\n".join(text.splitlines()[-8:])
                raise WeightCacheFailed(f"the weight cache daemon of {self.profile.name} exited before it was "
                                        f"ready; its log {record.log_path} ends:\n{last}", Reason.START_FAILED)
            if time.monotonic() - t0 > timeout_s:
                await self.stop(record)
                raise WeightCacheFailed(f"the weight cache daemon of {self.profile.name} was not ready within "
                                        f"{timeout_s:.0f} s (stopped it); see {record.log_path}", Reason.START_FAILED)
            await asyncio.sleep(READY_POLL_S)

    async def _ready(self, marker: str, text: str, since_spawn_s: float) -> bool:
        """The launcher's ready line (sglang, vllm) or the custom daemon's ready signals (custom_ready)."""
        if self.profile.backend != CUSTOM:
            return any(marker in line and (marker == VLLM_READY or "are ready" in line) for line in text.splitlines())
        daemon = _custom_daemon(self.profile)
        age = None
        if daemon.ready_file:
            try:
                found = await self.host.path_age(substitute(daemon.ready_file, self.profile))
            except HostError:
                found = None
            age = found.age_s if found is not None and found.plain else None
        return custom_ready(daemon, text, age, since_spawn_s)

    async def _log_tail(self, record: jobs.JobRecord) -> str:
        try:
            window = await self.host.read_window(record.log_path)
        except HostError:
            return ""
        return "" if window is None else "\n".join((*window.head, *window.tail))

    async def stop(self, record: jobs.JobRecord | None = None) -> bool:
        """SIGTERM the daemon's proven group, SIGKILL after the grace; whether one was running."""
        record = record or await self.current()
        if record is None:
            return False
        signalled = await jobs.signal_job(self.host, record, signal.SIGTERM)
        self.say(f"SIGTERM to the weight cache daemon's group {record.pgid} ({len(signalled)} processes)", "info")
        deadline = time.monotonic() + DAEMON_GRACE_S
        while await jobs.job_alive(self.host, record):
            if time.monotonic() > deadline:
                await jobs.signal_job(self.host, record, signal.SIGKILL)
                self.say(f"SIGKILL to the weight cache daemon's group {record.pgid}", "warning")
                deadline = time.monotonic() + DAEMON_GRACE_S
            await asyncio.sleep(0.05)
        record.outcome = "killed"
        with contextlib.suppress(jobs.StaleRecord):
            await jobs.save_job(self.host, record)
        return True
