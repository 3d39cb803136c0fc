"""What the scheduler says of an allocation and of a step, read from squeue/scontrol/srun output into typed values.

Pure parsing: SlurmHost runs the commands (app/core/hosts/slurm.py) and these turn their text into SlurmFacts,
step rows and the kind of failure an srun or squeue met (the controller unreachable, the job gone).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Literal

# squeue's job states that still hold the node; anything else is an allocation that ended.
HELD = ("RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING")
UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
               "Zero Bytes were transmitted or received", "Communication connection failure")
GONE = ("Invalid job id specified", "Job/step already completing or completed", "already completed",
        "Job has expired", "Invalid job state")
# A step the controller could not grant now but may grant a moment later (steps ending, a recovered job).
BUSY = ("Memory required by task is not available", "Requested nodes are busy", "Unable to create step")
SrunTrouble = Literal["", "unreachable", "gone", "busy"]
# A time left as squeue's %L prints it: [days-][hours:]minutes:seconds, or UNLIMITED / NOT_SET / INVALID.
_LEFT = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)")


@dataclass(frozen=True)
class SlurmFacts:
    """The allocation as last read: `state` is squeue's job state ("RUNNING", ...; "" before the first read,
    the final state from scontrol once it ended: "TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", ...);
    `time_left_s` None when unlimited or unknown; `reachable` False while slurmctld does not answer."""

    job: int | None = None
    node: str = ""
    state: str = ""
    reason: str = ""
    time_left_s: float | None = None
    read_at: float = 0.0
    reachable: bool = True
    detail: str = ""

    @property
    def ended(self) -> bool:
        """The allocation is over: nothing launched in it runs any more."""
        return bool(self.state) and self.state not in HELD and self.state != "PENDING"

    def header(self) -> str:
        """One short line for a header: "slurm 42 on node1: RUNNING, 1:02:03 left"."""
        if self.job is None:
            return "slurm: no allocation yet"
        where = f"slurm {self.job}" + (f" on {self.node}" if self.node else "")
        if not self.reachable:
            return f"{where}: slurmctld unreachable ({self.detail})"
        if self.ended:
            return f"{where}: ended ({self.state}{', ' + self.reason if self.reason not in ('', 'None') else ''})"
        left = "no time limit" if self.time_left_s is None else f"{format_left(self.time_left_s)} left"
        return f"{where}: {self.state or '?'}, {left}"


def parse_left(text: str) -> float | None:
    """squeue's %L as seconds; None for UNLIMITED, NOT_SET and anything that is not a time."""
    match = _LEFT.fullmatch(text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = (int(group) if group else 0 for group in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def format_left(seconds: float) -> str:
    """Seconds as H:MM:SS (or M:SS under an hour)."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def parse_job_line(text: str) -> tuple[str, float | None, str, str] | None:
    """`squeue -h -j J -o %T|%L|%N|%r`: (state, time left, node list, reason); None when squeue printed no row."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    parts = line.split("|")
    if len(parts) != 4:
        return None
    return parts[0], parse_left(parts[1]), parts[2], parts[3]


def parse_scontrol_job(text: str) -> dict[str, str]:
    """`scontrol -o show job J` as KEY -> value (the values tunedash reads have no spaces)."""
    fields: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def trouble(stderr: str) -> SrunTrouble:
    """What a failed srun/squeue/scancel met: the controller unreachable, the job or step gone, or neither."""
    if any(marker in stderr for marker in UNREACHABLE):
        return "unreachable"
    if any(marker in stderr for marker in GONE):
        return "gone"
    if any(marker in stderr for marker in BUSY):
        return "busy"
    return ""


def granted_job(stderr: str) -> int | None:
    """The job id in salloc's "Granted job allocation N" (or "Pending job allocation N")."""
    match = re.search(r"(?:Granted|Pending) job allocation (\d+)", stderr)
    return int(match[1]) if match else None


@dataclass(frozen=True)
class StepRecord:
    """What tunedash recorded of a step it launched: the step id (J.S), the node, the task's pid there and its
    start time, the step's name. It is the proof a kill needs: `scancel J.S` only while squeue shows that step
    under that name and the pid on the node is still that process."""

    step: str
    node: str
    pid: int
    start_time: str
    name: str

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> StepRecord | None:
        """The record, or None when `text` is not one (a record that does not read proves nothing)."""
        try:
            raw = json.loads(text)
            record = cls(str(raw["step"]), str(raw["node"]), int(raw["pid"]), str(raw["start_time"]),
                         str(raw["name"]))
        except (ValueError, KeyError, TypeError):
            return None
        return record if re.fullmatch(r"\d+\.\d+", record.step) else None


def parse_step_rows(text: str) -> dict[str, tuple[str, str]]:
    """`squeue -h -s ... -o %i|%j|%N` as step id -> (name, node)."""
    rows: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and re.fullmatch(r"\d+\.\d+", parts[0]):
            rows[parts[0]] = (parts[1], parts[2])
    return rows


def gres_gpu_indices(text: str) -> tuple[int, ...]:
    """The node GPU indices of a job from `scontrol show job -d J` ("GRES=gpu:2(IDX:0-1)", "IDX:0,2"); () when
    it shows none."""
    found = re.search(r"GRES=\S*?gpu[^(\s]*\(IDX:([0-9,-]+)\)", text)
    if found is None:
        return ()
    out: list[int] = []
    for part in found.group(1).split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return tuple(out)
