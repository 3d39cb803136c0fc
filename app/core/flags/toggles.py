"""The toggle rules: what a dashboard key does to a profile's flags, and the built-in toggles per backend.

Toggle decisions (what the dashboard's keys do by default):

SGLang
- `s` "steps": cycles --speculative-num-steps through 1..5. When --speculative-eagle-topk is 1, SGLang
  forces --speculative-num-draft-tokens to steps + 1 (docs/servers.md#sglang-command-line), so the toggle
  sets it too: the command line then says what the server will run.
  Needs --speculative-algorithm.
- `g` "pcg": keeps the prefill (piecewise) CUDA graph on past SGLang's auto-disable rules, in the flags of the
  version discovered (prefill_graph_toggle): on 0.5.15+ it cycles --cuda-graph-backend-prefill between absent
  (auto) and `breakable`; up to 0.5.12 (and while the version is unknown) it flips
  --enforce-piecewise-cuda-graph. From 0.5.10 piecewise CUDA graph is on by default, so flipping
  --disable-piecewise-cuda-graph would look like the obvious choice, but SGLang silently turns PCG
  off whenever --speculative-algorithm is set or the model is multimodal (docs/servers.md#sglang-command-line,
  `_handle_piecewise_cuda_graph`); only --enforce-piecewise-cuda-graph skips that cascade. With the
  speculative profiles this dashboard is built for, "disable" would change nothing, "enforce" visibly turns
  PCG on.
- `o` "overlap": one key cycling the four combinations of the overlap scheduler (--disable-overlap-schedule)
  and single-batch overlap (--enable-single-batch-overlap), in Gray-code order so that every press changes
  exactly one flag (the pending diff shows one line, an A/B run compares one change):
  sched (default) -> sched+sbo -> sbo -> off -> sched. A profile that wants two separate keys can define
  two flips in its [toggles] table.

vLLM
- `s` "spec": cycles speculative-config.num_speculative_tokens through 1..5 (needs --speculative-config).
- `e` "eager": flips --enforce-eager.
- `g` "graphs": cycles compilation-config.cudagraph_mode through NONE, PIECEWISE, FULL, FULL_DECODE_ONLY,
  FULL_AND_PIECEWISE (the V1 default, assumed when unset). --enforce-eager overrides it.

Custom: no toggles (a profile may define its own in a [toggles] table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal

from app.core.data import BACKENDS, FlagValue
from app.core.flags.catalog import release_tuple
from app.core.flags.values import CUSTOM, FlagError, format_value, get_flag, lookup_flag, set_flag

ToggleKind = Literal["cycle", "flip", "set"]


def sync_draft_tokens(flags: Mapping[str, FlagValue]) -> dict[str, FlagValue]:
    """SGLang: with --speculative-eagle-topk 1, set --speculative-num-draft-tokens to steps + 1.

    That is what SGLang itself forces (docs/servers.md#sglang-command-line); writing it keeps the command line honest.
    """
    new = dict(flags)
    steps = new.get("speculative-num-steps")
    if new.get("speculative-eagle-topk") == 1 and isinstance(steps, int) and not isinstance(steps, bool):
        new["speculative-num-draft-tokens"] = steps + 1
    return new


@dataclass(frozen=True)
class Toggle:
    """A key that flips, cycles or sets one or more flags.

    Every toggle is a list of `states`, each a tuple with one value per entry of `flags` (None = flag
    absent). A keypress moves to the state after the one the flags are in now (the first state when they
    match none). kind "flip" has the states (off, on); kind "set" a single state.
    """

    key: str  # one character
    label: str  # short: "steps", "pcg", "overlap"
    kind: ToggleKind
    flags: tuple[str, ...]  # flag names; "flag.key" for one key of a JSON flag
    states: tuple[tuple[FlagValue | None, ...], ...]
    names: tuple[str, ...] = ()  # a display name per state (optional)
    defaults: tuple[FlagValue | None, ...] = ()  # what the server uses when the flags are absent
    requires: str = ""  # a flag that must be set for this toggle to mean anything
    help: str = ""

    def state_index(self, flags: Mapping[str, FlagValue]) -> int | None:
        """Which state `flags` are in, or None."""
        current = self.current(flags)
        for index, state in enumerate(self.states):
            if state == current:
                return index
        return None

    def current(self, flags: Mapping[str, FlagValue]) -> tuple[FlagValue | None, ...]:
        """The toggle's flags' values in `flags` (absent ones as None)."""
        return tuple(get_flag(flags, name) for name in self.flags)


def apply_toggle(flags: Mapping[str, FlagValue], toggle: Toggle) -> dict[str, FlagValue]:
    """The flags after one press of `toggle` (a new dict; `flags` is not changed).

    Raises FlagError when the toggle `requires` a flag the profile does not set.
    """
    if toggle.requires and get_flag(flags, toggle.requires) is None:
        raise FlagError(f"{toggle.label}: the profile has no --{toggle.requires}; set it first "
                        f"(--set {toggle.requires}=...)")
    index = toggle.state_index(flags)
    target = toggle.states[0] if index is None else toggle.states[(index + 1) % len(toggle.states)]
    new = dict(flags)
    for name, value in zip(toggle.flags, target, strict=True):
        new = set_flag(new, name, value)
    if "speculative-num-steps" in toggle.flags:
        new = sync_draft_tokens(new)
    return new


def toggle_value(flags: Mapping[str, FlagValue], toggle: Toggle) -> str:
    """What the toggle's flags say now, for display: "3", "on", "sched+sbo", "FULL (default)"."""
    index = toggle.state_index(flags)
    if index is not None and toggle.names:
        return toggle.names[index]
    current = toggle.current(flags)
    if toggle.defaults and all(value is None for value in current):
        index = next((i for i, s in enumerate(toggle.states) if s == toggle.defaults), None)
        shown = toggle.names[index] if index is not None and toggle.names else "/".join(
            format_value(v) for v in toggle.defaults)
        return f"{shown} (default)"
    if toggle.kind == "flip":
        return "on" if current[0] is True else "off"
    return "/".join(format_value(value) for value in current)


def flip(key: str, label: str, backend: str, flag: str, help: str = "") -> Toggle:
    """A toggle that turns a bool flag on and off (off = absent, or False for a negatable flag)."""
    spec = lookup_flag(backend, flag)
    if spec is None or spec.kind != "bool":
        raise FlagError(f"a flip toggle needs a boolean flag; --{flag} is not one")
    off: FlagValue | None = False if spec.negatable else None
    return Toggle(key, label, "flip", (spec.name,), ((off,), (True,)), help=help or spec.help)


PREFILL_BACKEND_SINCE = (0, 5, 15)
"""SGLang 0.5.15 replaced the piecewise CUDA graph flags with --cuda-graph-backend-prefill (docs/servers.md)."""


def prefill_graph_toggle(backend: str, version: str | None) -> Toggle:
    """`g`: keep SGLang's prefill (piecewise) CUDA graph on where SGLang would switch it off, in the flags of
    `version`: --enforce-piecewise-cuda-graph up to 0.5.12, --cuda-graph-backend-prefill breakable from 0.5.15
    (an explicit prefill backend skips the multimodal auto-disable). Unknown version: the 0.5.10 form."""
    release = release_tuple(version)
    if release is not None and release >= PREFILL_BACKEND_SINCE:
        return Toggle("g", "pcg", "cycle", ("cuda-graph-backend-prefill",), ((None,), ("breakable",)),
                      names=("auto", "breakable"),
                      help="Prefill CUDA graph kept on (breakable backend), past SGLang's auto-disable rules")
    return flip("g", "pcg", backend, "enforce-piecewise-cuda-graph",
                "Piecewise CUDA graph, enforced past SGLang's auto-disable rules")


def merge_toggles(defaults: Sequence[Toggle], own: Sequence[tuple[str, Toggle | None]]) -> tuple[Toggle, ...]:
    """The built-in toggles with a profile's own [toggles] entries on top (None removes a key)."""
    merged = {toggle.key: toggle for toggle in defaults}
    for key, toggle in own:
        if toggle is None:
            merged.pop(key, None)
        else:
            merged[key] = toggle
    return tuple(merged.values())


@cache
def default_toggles(backend: str, version: str | None = None) -> tuple[Toggle, ...]:
    """The built-in toggles of `backend` for the server `version` in front of it (None: not known yet), used
    for every key a profile's [toggles] table does not define (module docstring)."""
    if backend == "sglang":
        return (
            Toggle("s", "steps", "cycle", ("speculative-num-steps",), tuple((n,) for n in range(1, 6)),
                   requires="speculative-algorithm",
                   help="Speculative steps 1-5 (draft tokens follow when topk is 1)"),
            prefill_graph_toggle(backend, version),
            Toggle("o", "overlap", "cycle", ("disable-overlap-schedule", "enable-single-batch-overlap"),
                   ((None, None), (None, True), (True, True), (True, None)),
                   names=("sched", "sched+sbo", "sbo", "off"),
                   help="Overlap scheduler and single-batch overlap, one change per press"),
        )
    if backend == "vllm":
        return (
            Toggle("s", "spec", "cycle", ("speculative-config.num_speculative_tokens",),
                   tuple((n,) for n in range(1, 6)), requires="speculative-config",
                   help="Speculative tokens 1-5 inside --speculative-config"),
            flip("e", "eager", backend, "enforce-eager", "Eager mode: no torch.compile, no CUDA graphs"),
            Toggle("g", "graphs", "cycle", ("compilation-config.cudagraph_mode",),
                   tuple((m,) for m in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY",
                                        "FULL_AND_PIECEWISE")),
                   defaults=("FULL_AND_PIECEWISE",), help="CUDA graph mode inside --compilation-config"),
        )
    if backend == CUSTOM:
        return ()
    raise FlagError(f"unknown backend {backend!r}; use one of: {', '.join(BACKENDS)}")


def toggle_for_flag(toggles: Sequence[Toggle], flag: str) -> Toggle | None:
    """The toggle that changes `flag` (or a key of it), if any."""
    for toggle in toggles:
        if flag in toggle.flags:
            return toggle
    return None
