"""The profile data types: Profile, BenchSettings, TuneSettings and ProfileError (app.core.profiles.loading uses
them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from app.core.data import Backend, FlagValue
from app.core.errors import TunedashError
from app.core.flags.toggles import Toggle
from app.core.hosts.slurm_request import SlurmRequest


class ProfileError(TunedashError, ValueError):
    """A profile that cannot be used. The message names the file (or --set), the key and what to do; `problems`
    holds each problem when the reader found several (app.core.profiles.schema reports them all at once)."""

    title = "Bad profile"

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)


@dataclass(frozen=True)
class BenchSettings:
    """The [bench] table: the fixed request set of a benchmark run."""

    concurrency: int = 4
    requests: int = 32
    input_len: int = 512
    output_len: int = 256
    warmup: int = 2  # requests sent and discarded before the trials
    trials: int = 3  # trials per launch of an A/B arm
    launches: int = 2  # launches per A/B arm (the unit of the A/B's interval: app.core.measure.stats)
    endpoint: str = "completions"  # "completions" | "chat"
    seed: int = 0
    slo_ttft_ms: float | None = None  # goodput: a request meets the SLOs when its TTFT is at most this (ms)
    slo_tpot_ms: float | None = None  # ... and its time per output token after the first at most this (ms)


@dataclass(frozen=True)
class TuneOption:
    """One value of a tuned axis: its label as the user wrote it ("3", "on", "sched+sbo") and the flags it sets
    (flag, value); value None unsets the flag."""

    label: str
    sets: tuple[tuple[str, FlagValue | None], ...]


@dataclass(frozen=True)
class TuneAxis:
    """One dimension of a tune space: a flag (`[tune.flags]`) or a toggle's states (`[tune.toggles]`, by key)."""

    name: str  # the flag's name, or the toggle's key ("g", "o")
    label: str  # the flag's name, or the toggle's label ("pcg", "overlap")
    options: tuple[TuneOption, ...]


@dataclass(frozen=True)
class TuneShape:
    """One request shape of a tune run: concurrency x input/output lengths, and how many requests measure it."""

    concurrency: int
    input_len: int
    output_len: int
    requests: int

    @property
    def label(self) -> str:
        """"c4 256/128": concurrency, input / output tokens (the shape's name in boards and exports)."""
        return f"c{self.concurrency} {self.input_len}/{self.output_len}"


TUNE_OBJECTIVES = ("stream_tok_s", "total_tok_s", "goodput", "j_per_token")
"""What a tune run ranks by: output tok/s per stream, total output tok/s, goodput (requests/s within the [bench]
SLOs) or energy per output token (lower is better)."""


@dataclass(frozen=True)
class TuneSettings:
    """The [tune] table (app.core.profiles.tune_table): the space, the request shapes, the objective, the
    constraints and the racing rule's parameters (app.core.tune)."""

    axes: tuple[TuneAxis, ...]
    shapes: tuple[TuneShape, ...]
    exclude: tuple[tuple[tuple[str, str], ...], ...] = ()  # each: (axis name, option label) pairs, all must match
    objective: str = "stream_tok_s"
    ttft_p95_ms: float | None = None  # constraint: a candidate over it at a shape cannot win that shape
    tpot_p95_ms: float | None = None
    max_launches: int | None = None  # None: twice the candidates (the two-launch grid's count)
    time_budget_s: float | None = None
    confidence: float = 0.95
    tie_pct: float = 2.0
    min_launches: int = 1  # launches each candidate gets before the rule may drop it
    advisor_seeds: bool = True  # add the advisor's fixes of the running server as candidates


@dataclass(frozen=True)
class CustomDaemon:
    """A custom profile's [warm] table: the daemon tunedash starts before `command` and keeps across relaunches
    (app.core.server.warm), ready on a line of its log (`ready_regex`) and/or a file it writes (`ready_file`);
    `client_args` go after the command when it runs as the daemon's client. Placeholders as in `command`."""

    command: tuple[str, ...]
    ready_regex: str = ""
    ready_file: str = ""
    client_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profile:
    """A validated profile. Change it with dataclasses.replace or apply_overrides; never in place."""

    name: str
    source: Path
    host: str
    backend: Backend
    python: str
    model: str
    port: int
    gpus: tuple[int, ...]
    env: dict[str, str]
    flags: dict[str, FlagValue]
    toggles: tuple[Toggle, ...]  # the built-in toggles for the server's version, with own_toggles on top
    bench: BenchSettings = field(default_factory=BenchSettings)
    module: str = ""
    sim_state: Path | None = None
    sim_version: str = ""  # the simulated SGLang's version (host = "sim"); checked by app.connect
    sim_gpus: str = ""  # the simulated host's GPUs, e.g. "2xH200" (host = "sim"); checked by app.connect
    description: str = ""
    # keep the weights in the backend's weight cache daemon across relaunches (app.core.server.warm)
    warm: bool = False
    daemon: CustomDaemon | None = None  # backend = "custom" with a [warm] table: its daemon (warm is then True)
    # backend = "custom" only (app.core.profiles.loading's docstring): the argv template and the ready signal.
    command: tuple[str, ...] = ()
    ready_regex: str = ""
    health_url: str = ""
    # the profile's own [toggles] entries ((key, None) removes a built-in one), kept so that the toggles can be
    # rebuilt for the server version discovery finds (app.core.profiles.loading.for_server_version)
    own_toggles: tuple[tuple[str, Toggle | None], ...] = ()
    # sglang/vllm: a console-script launch (`python SCRIPT serve ...` instead of `python -m MODULE`), and
    # argv items passed verbatim after the flags (what the catalog does not know); `tunedash adopt` writes them
    script: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    ready_timeout_s: float = 600.0  # how long a relaunch waits for READY (the CLI's --ready-timeout default)
    tune: TuneSettings | None = None  # the [tune] table, None when the profile has none
    # host = "slurm:..." only: the allocation to attach to or ask for (app.core.hosts.slurm_request)
    slurm: SlurmRequest | None = None

    def toggle(self, key: str) -> Toggle | None:
        """The toggle bound to `key`, if any."""
        return next((t for t in self.toggles if t.key == key), None)
