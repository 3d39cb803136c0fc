"""A tune run's candidates: the [tune] space's product, exclusions, seeds (running config, advisor fixes), and
the ones the installed server rejects, dropped with the reason (app.core.flags.discovery)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from app.core.data import FlagValue
from app.core.flags.discovery import ServerFlags, rejection_message
from app.core.flags.toggles import sync_draft_tokens
from app.core.flags.values import format_value, get_flag, set_flag
from app.core.profiles.render import flag_diff
from app.core.profiles.types import Profile, TuneSettings

DRAFT = "speculative-num-draft-tokens"
STEPS = "speculative-num-steps"


@dataclass(frozen=True)
class Candidate:
    """One configuration of a tune run: its name (the axes' values, "steps=3 pcg=on"), the flags it launches with,
    and where it came from ("space", "running", "advisor: FINDING")."""

    label: str
    flags: dict[str, FlagValue]
    source: str = "space"
    settings: tuple[tuple[str, str], ...] = ()  # (axis name, option label), empty for a seed outside the space

    def overrides(self, base: Mapping[str, FlagValue]) -> str:
        """The candidate as `ab --a` overrides of the profile's flags: "F=V F=V !F" ("" when it is the profile)."""
        words = []
        for change in flag_diff(base, self.flags):
            if change.new is None:
                words.append(f"!{change.flag}")
            else:
                value = change.new
                text = ("true" if value is True else "false" if value is False else format_value(value))
                words.append(f"{change.flag}={text}")
        return " ".join(words)


@dataclass(frozen=True)
class Dropped:
    """A candidate left out before the run, and why (an exclusion, a server that rejects a flag, a duplicate)."""

    label: str
    why: str


@dataclass(frozen=True)
class TuneSpace:
    """The candidates to race, in order (seeds first), and the ones dropped with why."""

    candidates: tuple[Candidate, ...]
    dropped: tuple[Dropped, ...] = field(default_factory=tuple)


def _excluded(settings: Sequence[tuple[str, str]], rules: Iterable[Sequence[tuple[str, str]]]) -> str | None:
    picked = dict(settings)
    for rule in rules:
        if all(picked.get(axis) == label for axis, label in rule):
            return "excluded by [tune] exclude: " + ", ".join(f"{a} = {v}" for a, v in rule)
    return None


def space_flags(base: Mapping[str, FlagValue], sets: Iterable[tuple[str, FlagValue | None]],
                tunes_draft: bool) -> dict[str, FlagValue]:
    """`base` with `sets` applied; draft tokens follow the steps (the toggle rule) unless they are tuned too."""
    flags = dict(base)
    names = []
    for name, value in sets:
        flags = set_flag(flags, name, value)
        names.append(name)
    if STEPS in names and not tunes_draft:
        flags = sync_draft_tokens(flags)
    return flags


def expand(profile: Profile, tune: TuneSettings) -> tuple[list[Candidate], list[Dropped]]:
    """Every combination of the axes' options applied to the profile's flags, in the axes' order; exclusions
    dropped with the rule that matched."""
    tunes_draft = any(name == DRAFT for a in tune.axes for o in a.options for name, _ in o.sets)
    kept: list[Candidate] = []
    dropped: list[Dropped] = []
    for combo in itertools.product(*(a.options for a in tune.axes)):
        settings = tuple((axis.name, option.label) for axis, option in zip(tune.axes, combo, strict=True))
        label = " ".join(f"{axis.label}={option.label}" for axis, option in zip(tune.axes, combo, strict=True))
        why = _excluded(settings, tune.exclude)
        if why is not None:
            dropped.append(Dropped(label, why))
            continue
        flags = space_flags(profile.flags, (s for option in combo for s in option.sets), tunes_draft)
        kept.append(Candidate(label, flags, "space", settings))
    return kept, dropped


def _requires(profile: Profile, candidate: Candidate) -> str | None:
    """Why a candidate's toggle state means nothing: the toggle requires a flag the candidate does not set."""
    for axis, _label in candidate.settings:
        toggle = profile.toggle(axis) if len(axis) == 1 else None
        if toggle is not None and toggle.requires and get_flag(candidate.flags, toggle.requires) is None:
            return f"{toggle.label} needs --{toggle.requires}, which this candidate does not set"
    return None


def build_space(profile: Profile, tune: TuneSettings, *, running: Mapping[str, FlagValue] | None = None,
                fixes: Sequence[tuple[str, Mapping[str, FlagValue | None]]] = (),
                server: ServerFlags | None = None) -> TuneSpace:
    """The candidates of a tune run: the running config first (`running`, else the profile's flags), then each
    advisor fix applied to it (`fixes`: (finding, flags to set; None unsets)), then the space. A candidate equal to
    an earlier one is merged into it (its label noted); one the installed server (`server`) would reject at
    argument parsing is dropped with discovery's reason, as is one whose toggle lacks the flag it requires."""
    start = dict(running if running is not None else profile.flags)
    seeds = [Candidate("running", start, "running")]
    for finding, fix in fixes:
        flags = dict(start)
        for name, value in fix.items():
            flags = set_flag(flags, name, value)
        if STEPS in fix and DRAFT not in fix:
            flags = sync_draft_tokens(flags)
        seeds.append(Candidate(f"advisor {finding}", flags, f"advisor: {finding}"))
    space, dropped = expand(profile, tune)
    kept: list[Candidate] = []
    for candidate in [*seeds, *space]:
        twin = next((i for i, c in enumerate(kept) if c.flags == candidate.flags), None)
        if twin is not None:
            first = kept[twin]
            if first.source != "space" and candidate.source == "space":  # the seed is a point of the space
                kept[twin] = Candidate(candidate.label, first.flags, f"{first.source} = space", candidate.settings)
            else:
                dropped.append(Dropped(candidate.label, f"the same flags as {first.label}"))
            continue
        why = _requires(profile, candidate)
        if why is None and server is not None:
            why = rejection_message(server, candidate.flags, f"candidate {candidate.label}")
        if why is not None:
            dropped.append(Dropped(candidate.label, why))
            continue
        kept.append(candidate)
    return TuneSpace(tuple(kept), tuple(dropped))
