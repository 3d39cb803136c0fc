"""A Slurm profile's host spec and `[slurm]` table: how to reach the scheduler and which allocation to use.

    host = "slurm:local"                 # tunedash runs on the login node: srun, squeue, scancel run here
    host = "slurm://login-alias"         # the login node over SSH (ssh://user@host:port spelling works too)

    [slurm]
    job = 4242                           # attach to this allocation (it must be running), or ask for one:
    partition = "gpu"                    #   salloc --no-shell -N1 -J tunedash -p gpu
    gpus = 2                             #     --gpus=2
    time = "02:00:00"                    #     --time=02:00:00
    account = "proj42"                   #     -A proj42
    salloc_args = ["--qos=short"]        #     ... verbatim, after the others

Every value becomes an argv item of `salloc` (never a shell string); every bad value is a problem naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

SLURM_KEYS = ("job", "partition", "gpus", "time", "account", "salloc_args", "node")
# Slurm's own spellings: [days-]hours:minutes:seconds and its shorter forms, or minutes.
_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|UNLIMITED|INFINITE")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._,:+-]*")
STEP_NAME = "tunedash"  # every step tunedash launches is named this (+ "-" and the launch's tag)
JOB_NAME = "tunedash"  # the allocations tunedash asks for


@dataclass(frozen=True)
class SlurmRequest:
    """Where to run: `login` is "local" (this machine is the login node) or the SSH spec of the login node; `job`
    an allocation to attach to, else the salloc request (partition, gpus, time, account, extra args)."""

    login: str = "local"
    job: int | None = None
    partition: str = ""
    gpus: int = 0
    time: str = ""
    account: str = ""
    salloc_args: tuple[str, ...] = ()
    node: str = ""  # the node of the allocation to use (a multi-node job); "" = its first node
    job_name: str = JOB_NAME  # `tunedash`, or `tunedash@sloti` for a `tune --slots` slot's own allocation
    immediate_s: int = 0  # > 0: salloc --immediate=S (a slot's grant deadline; not granted by then = refused)

    def salloc_argv(self) -> list[str]:
        """The `salloc --no-shell` that asks for the allocation (argv list)."""
        argv = ["salloc", "--no-shell", "-N1", "-J", self.job_name]
        if self.immediate_s > 0:
            argv.append(f"--immediate={self.immediate_s}")
        if self.partition:
            argv += ["-p", self.partition]
        if self.gpus:
            argv.append(f"--gpus={self.gpus}")
        if self.time:
            argv.append(f"--time={self.time}")
        if self.account:
            argv += ["-A", self.account]
        return [*argv, *self.salloc_args]

    def for_slot(self, index: int, immediate_s: int, gpus: int) -> SlurmRequest:
        """Slot `index`'s own request (`tune --slots` over several allocations): the same request under the job
        name `tunedash@slotINDEX` with a grant deadline; an attached job is slot 0's only, so never copied, and
        a slot beside an attached job asks for `gpus` (as many as the profile uses)."""
        return replace(self, job=None, job_name=f"{JOB_NAME}@slot{index}", immediate_s=immediate_s,
                       gpus=self.gpus if self.job is None else gpus)

    def describe(self) -> str:
        """One line for messages: the job attached to, or the request."""
        if self.job is not None:
            return f"job {self.job}"
        return " ".join(self.salloc_argv()[1:])


def slurm_login(spec: str) -> str | None:
    """The login part of a `slurm:` host spec: "local", an SSH spec (ssh://... or an alias), or None when `spec`
    is not a Slurm host. ValueError when it is one but cannot be read."""
    if spec == "slurm:local":
        return "local"
    if not spec.startswith("slurm://"):
        if spec.startswith("slurm:"):
            raise ValueError(f"cannot read {spec!r}; write \"slurm:local\" (on the login node) or "
                             "\"slurm://LOGIN\" (an ssh config alias or user@host:port)")
        return None
    rest = spec[len("slurm://"):]
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", rest):
        return rest
    if re.fullmatch(r"([A-Za-z0-9._-]+@)?[A-Za-z0-9][A-Za-z0-9._-]*(:\d{1,5})?", rest):
        port = rest.rpartition(":")[2] if ":" in rest else "22"
        if 0 < int(port) < 65536:
            return "ssh://" + rest
    raise ValueError(f"cannot read {spec!r}; write slurm://LOGIN with LOGIN an ssh config alias or user@host:port")


def read_slurm_table(login: str, table: Mapping[str, Any]) -> tuple[SlurmRequest, list[str]]:
    """The request in a profile's [slurm] table, and its problems ("slurm.KEY: ...", every one)."""
    problems: list[str] = []
    for key in table:
        if key not in SLURM_KEYS:
            problems.append(f"slurm.{key}: unknown key; allowed keys: {', '.join(SLURM_KEYS)}")
    values: dict[str, Any] = {}
    job = table.get("job")
    if job is not None:
        if isinstance(job, bool) or not isinstance(job, int) or job <= 0:
            problems.append(f"slurm.job: expected a job id (an integer above 0), got {job!r}")
        else:
            values["job"] = job
    gpus = table.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        problems.append(f"slurm.gpus: expected a number of GPUs (0 or more), got {gpus!r}")
    else:
        values["gpus"] = gpus
    for key in ("partition", "account", "node"):
        value = table.get(key, "")
        if not isinstance(value, str) or (value and not _WORD.fullmatch(value)):
            problems.append(f"slurm.{key}: expected a Slurm name (letters, digits, . _ , : + -), got {value!r}")
        else:
            values[key] = value
    time = table.get("time", "")
    if not isinstance(time, str) or (time and not _TIME.fullmatch(time)):
        problems.append(f"slurm.time: expected a Slurm time limit (minutes, HH:MM:SS or D-HH:MM:SS), got {time!r}")
    else:
        values["time"] = time
    extra = table.get("salloc_args", [])
    if not isinstance(extra, list) or not all(isinstance(item, str) for item in extra):
        problems.append(f"slurm.salloc_args: expected a list of strings (argv items for salloc), got {extra!r}")
    elif any(not item.startswith("-") for item in extra):
        problems.append("slurm.salloc_args: every item is an option (starts with '-'): salloc gets no command, "
                        f"tunedash launches into the allocation; got {extra!r}")
    else:
        values["salloc_args"] = tuple(extra)
    if "job" in values and any(table.get(key) for key in ("partition", "gpus", "time", "account", "salloc_args")):
        problems.append("slurm.job: attaching to a job takes no allocation request; remove job, or remove "
                        "partition, gpus, time, account and salloc_args")
    return SlurmRequest(login=login, **values), problems
