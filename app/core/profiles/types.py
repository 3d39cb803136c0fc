"""The profile data types: Profile, BenchSettings, FlagChange and ProfileError (app.core.profiles.loading uses them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from app.core.flags.rules import FlagValue, Toggle


class ProfileError(ValueError):
    """A profile that cannot be used. The message names the file (or --set), the key and what to do."""


@dataclass(frozen=True)
class BenchSettings:
    """The [bench] table: the fixed request set of a benchmark run."""

    concurrency: int = 4
    requests: int = 32
    input_len: int = 512
    output_len: int = 256
    warmup: int = 2  # requests sent and discarded before the trials
    trials: int = 3
    endpoint: str = "completions"  # "completions" | "chat"
    seed: int = 0


@dataclass(frozen=True)
class Profile:
    """A validated profile. Change it with dataclasses.replace or apply_overrides; never in place."""

    name: str
    source: Path
    host: str
    backend: str
    python: str
    model: str
    port: int
    gpus: tuple[int, ...]
    env: dict[str, str]
    flags: dict[str, FlagValue]
    toggles: tuple[Toggle, ...]
    bench: BenchSettings = field(default_factory=BenchSettings)
    module: str = ""
    sim_state: Path | None = None
    description: str = ""
    # backend = "custom" only (app.core.profiles.loading's docstring): the argv template and the ready signal.
    command: tuple[str, ...] = ()
    ready_regex: str = ""
    health_url: str = ""

    def toggle(self, key: str) -> Toggle | None:
        """The toggle bound to `key`, if any."""
        return next((t for t in self.toggles if t.key == key), None)


@dataclass(frozen=True)
class FlagChange:
    """One difference between two flag sets. `flag` is dotted for a key of a JSON flag; None = absent."""

    flag: str
    old: FlagValue | None
    new: FlagValue | None

    @property
    def kind(self) -> str:
        """"added", "removed" or "changed"."""
        if self.old is None:
            return "added"
        return "removed" if self.new is None else "changed"
