"""Plain data shared by the core, the CLI and the widgets: GPU samples, server states, log events, flag changes.

Widgets may import this module and no other of app.core (pyproject's import contracts), so a type that a
widget shows as it is lives here. The string states that travel in files and events are Literals here too,
with the validator that reads them where they enter (a profile, a job record).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, TypeVar, get_args

Backend = Literal["sglang", "vllm", "custom"]
"""The server a profile launches: SGLang, vLLM, or any command (the "custom" backend). Spelled so in TOML."""
BACKENDS: tuple[Backend, ...] = get_args(Backend)
"""Every Backend, in the order error messages list them."""

ConnectionState = Literal["connected", "lost", "reconnecting", "failed"]
"""The connection to a remote host: up, dropped, being retried, or given up on."""

EventLevel = Literal["info", "warning", "error"]
"""How much an event-log line matters."""

JobOutcome = Literal["running", "ready", "crashed", "killed", "launching"]
"""How a launch recorded in a job file went so far: started, ready, died on its own, or killed by us; "launching"
is the record written before the spawn (its tag, no pid yet). Spelled so in the job record's JSON."""
JOB_OUTCOMES: tuple[JobOutcome, ...] = get_args(JobOutcome)

_Named = TypeVar("_Named", bound=str)


def one_of(value: object, choices: tuple[_Named, ...]) -> _Named | None:
    """`value` as one of `choices` (a Literal's values), or None when it is none of them: the check a string
    read from a file or the network passes before it travels inward as a typed state."""
    return next((choice for choice in choices if choice == value), None)


FlagValue = bool | int | float | str | dict[str, Any]
"""A flag's value in a profile (JSON-kind flags hold a dict), or one word of a command line."""


@dataclass(frozen=True)
class FlagChange:
    """One difference between two flag sets. `flag` is dotted for a key of a JSON flag; None = absent.

    A profile diff (app.core.profiles.loading.flag_diff) holds typed values; the diff screen's command-line
    diff holds the words (a bare switch is "")."""

    flag: str
    old: FlagValue | None
    new: FlagValue | None

    @property
    def kind(self) -> Literal["added", "removed", "changed"]:
        """"added", "removed" or "changed"."""
        if self.old is None:
            return "added"
        return "removed" if self.new is None else "changed"


@dataclass(frozen=True)
class GpuProcess:
    """One compute process holding memory on one GPU."""

    pid: int
    name: str
    used_mib: int | None  # None when the driver cannot say (WDDM: "[N/A]")
    gpu_uuid: str = ""


@dataclass(frozen=True)
class Holder:
    """Something still holding memory on a GPU: a process, or memory with no visible process (pid None)."""

    gpu: int
    pid: int | None
    name: str
    used_mib: int | None
    # whose it is, when asked (jobs.with_owners): "this job's (tagged)", "not tunedash's", ...; "" not asked
    owner: str = field(default="", compare=False)

    def describe(self) -> str:
        mib = "? MiB" if self.used_mib is None else f"{self.used_mib} MiB"
        if self.pid is None:
            return f"GPU{self.gpu}: {mib} held, no visible process"
        whose = f" ({self.owner})" if self.owner else ""
        return f"GPU{self.gpu}: pid {self.pid} {self.name} {mib}{whose}"


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU at one moment.

    Any value that could not be read is None and `unavailable[field_name]` holds the reason
    (for example "[N/A]", "[GPU is lost]", "NVMLError_NotSupported"). Never 0 for "unknown".
    """

    index: int
    uuid: str
    name: str | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    processes: tuple[GpuProcess, ...] | None = None  # None: process list not read
    unavailable: dict[str, str] = field(default_factory=dict)
    taken_at: float = 0.0  # time.monotonic() of the client when the sample was taken
    source: str = ""  # "nvml" or "smi"
    # time.monotonic() when the query that produced `processes` started; the list describes the GPU at or
    # after that moment (it can be older than taken_at: process lists are refreshed less often)
    processes_taken_at: float | None = None
    memory_api: str = ""  # what memory_used_mib means: "smi", "nvml_v2" (same as smi) or "nvml_v1" (+reserved)


@dataclass(frozen=True)
class TelemetryError:
    """A whole telemetry read failed (nvidia-smi missing, driver mismatch, NVML init error...)."""

    kind: str  # "not_found" | "driver" | "no_devices" | "bad_field" | "lost" | "permission" | "garbage" | "other"
    # or "connection": the host itself (SSH) was lost or refused us, not the GPU tool on it
    message: str  # the tool's own text, verbatim
    exit_code: int | None = None
    hint: str = ""  # what the user can do


@dataclass(frozen=True)
class GpuSnapshot:
    """All GPUs of a host at one tick, or the error that stopped the read."""

    gpus: tuple[GpuSample, ...]
    taken_at: float
    error: TelemetryError | None = None
    skipped_lines: int = 0  # lines the parser could not read


class ServerState(StrEnum):
    """The lifecycle states of a server (docs/architecture.md#server-states)."""

    STOPPED = "STOPPED"
    LAUNCHING = "LAUNCHING"
    LOADING = "LOADING"
    CAPTURING = "CAPTURING"
    WARMING = "WARMING"
    READY = "READY"
    KILLING = "KILLING"
    RELEASING = "RELEASING"
    FREE = "FREE"
    WARM = "WARM"  # the engine is gone; only this profile's weight cache daemon holds GPU memory
    CRASHED = "CRASHED"
    STUCK = "STUCK"


class Phase(StrEnum):
    """Startup phases a backend log reveals."""

    INIT = "init"  # server args printed, process started
    WEIGHTS = "weights"
    KV_CACHE = "kv_cache"
    CUDA_GRAPH = "cuda_graph"
    PIECEWISE_CUDA_GRAPH = "piecewise_cuda_graph"
    WARMUP = "warmup"
    READY = "ready"


@dataclass(frozen=True)
class LogLine:
    """Where an event came from in the log."""

    number: int  # 1-based line number in the log
    text: str  # the line with ANSI colour stripped


LOG_LINE_MAX = 64 * 1024
"""The longest log line kept (characters; bytes where it is read from a file): the rest is cut where lines enter
(LocalHost.follow and SshHost's streams through app.core.hosts.lines, app.core.logs.parser.read_log_lines and
LogParser.feed) and LOG_LINE_CUT marks the cut."""

LOG_LINE_CUT = " ... [line cut at 64 KiB]"


def cap_log_line(text: str) -> str:
    """`text` cut to LOG_LINE_MAX characters, with LOG_LINE_CUT after the cut; unchanged when it fits or was cut
    already (a line cut where it was read is not cut again where it is parsed)."""
    if len(text) <= LOG_LINE_MAX or (text.endswith(LOG_LINE_CUT) and len(text) <= LOG_LINE_MAX + len(LOG_LINE_CUT)):
        return text
    return text[:LOG_LINE_MAX] + LOG_LINE_CUT


@dataclass(frozen=True)
class PhaseEvent:
    """A startup phase began or ended. `seconds` is the backend's own elapsed figure when it prints one."""

    phase: Phase
    begin: bool
    line: LogLine
    seconds: float | None = None
    detail: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadyEvent:
    """The backend's ready line."""

    line: LogLine
    timestamp: str | None = None  # the line's timestamp text, else the last one seen before it (uvicorn lines)


@dataclass(frozen=True)
class DecodeStats:
    """One periodic throughput line (SGLang "Decode batch", vLLM "Avg generation throughput")."""

    gen_tps: float
    line: LogLine
    accept_len: float | None = None
    accept_rate: float | None = None
    running: int | None = None
    queued: int | None = None
    token_usage: float | None = None
    cuda_graph: bool | None = None
    timestamp: str | None = None  # the log's own timestamp text


@dataclass(frozen=True)
class PrefillStats:
    """One SGLang "Prefill batch" line: the prompt tokens it took in, and whether the prefill graph ran."""

    input_tps: float | None  # "input throughput (token/s)"; None on releases that do not print it
    line: LogLine
    new_seqs: int | None = None
    new_tokens: int | None = None
    cached_tokens: int | None = None
    running: int | None = None
    queued: int | None = None
    token_usage: float | None = None
    cuda_graph: bool | None = None  # the prefill (piecewise/breakable) graph served this batch
    timestamp: str | None = None  # the log's own timestamp text


@dataclass(frozen=True)
class ServerCapacity:
    """What a started SGLang server can hold (its "max_total_num_tokens=..." line), GiB as SGLang prints "GB"."""

    max_total_tokens: int
    line: LogLine
    max_running_requests: int | None = None
    context_len: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    available_gib: float | None = None  # device memory left after weights, pools and graphs


@dataclass(frozen=True)
class SpecDecodeStats:
    """vLLM "SpecDecoding metrics" line."""

    mean_accept_len: float | None
    accepted: int
    drafted: int
    line: LogLine
    accept_rate: float | None = None  # 0..1; V1 "Avg Draft acceptance rate", V0 "Draft acceptance rate"
    timestamp: str | None = None  # the log's own timestamp text


@dataclass(frozen=True)
class Notice:
    """Something the user should know: an auto-disabled feature, a deprecation, an auto-adjustment."""

    kind: str  # "auto_disabled" | "auto_adjusted" | "deprecation" | "warning"
    text: str
    line: LogLine
    feature: str | None = None  # what it is about, when known: "prefill_cuda_graph" | "cuda_graph"


@dataclass(frozen=True)
class FatalEvent:
    """The server failed: OOM, port in use, a traceback. `context` holds the lines around it."""

    kind: str  # "oom" | "port_in_use" | "traceback" | "child_failed" | "child_crashed" | "error"
    text: str
    line: LogLine
    context: tuple[str, ...] = ()


LogEvent = PhaseEvent | ReadyEvent | DecodeStats | PrefillStats | SpecDecodeStats | ServerCapacity | Notice | FatalEvent


@dataclass(frozen=True)
class ThroughputPoint:
    """One tokens/s figure at one moment, from one source ("log", "metrics", "probe")."""

    at: float  # wall-clock seconds (time.time())
    tokens_per_s: float
    source: str
    accept_len: float | None = None


@dataclass(frozen=True)
class RelaunchMarker:
    """Where a relaunch happened on the throughput chart (wall-clock `at`), and with which change ("steps 1 -> 3")."""

    at: float
    text: str


CONTROL_CHARACTERS = frozenset([*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)])
"""C0, DEL and C1: the code points a terminal may act on (ESC starts a sequence, BEL ends one, 0x9B is CSI)."""
_VISIBLE = {code: f"\\x{code:02x}" for code in CONTROL_CHARACTERS}


def printable(text: str) -> str:
    """`text` with every control character written out visibly (ESC as `\\x1b`), so a value read from a profile, a
    record or a host never reaches the terminal as a control sequence; anything else is unchanged."""
    return text.translate(_VISIBLE)


def first_control_character(text: str) -> int | None:
    """The index of the first control character in `text` (CONTROL_CHARACTERS), or None."""
    return next((i for i, ch in enumerate(text) if ord(ch) in CONTROL_CHARACTERS), None)
