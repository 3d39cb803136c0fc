"""A Profile rendered for launch (argv, environment, health URL) and the diffs between two flag sets.

launch_argv/custom_argv build the server's command line (an argv list, never a string), launch_env its
environment, health_url the URL that confirms it ready; flag_diff/profile_diff list what changed between
two flag sets or profiles and describe_change says one change for people ("steps 1 -> 3").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.core.data import FlagChange, FlagValue
from app.core.flags.toggles import Toggle, toggle_for_flag
from app.core.flags.values import CUSTOM, catalog, format_value, free_flag, render_flag, unknown_flag_message
from app.core.profiles.schema import PLACEHOLDER
from app.core.profiles.types import Profile, ProfileError

MODEL_FLAG = {"sglang": "model-path", "vllm": "model", "custom": "model"}


def launch_argv(profile: Profile) -> list[str]:
    """The server's command line as an argv list: python -m MODULE --model-path M --port P FLAGS...

    vLLM gets `--model M` (the api_server module's form). A profile with `script` runs `python SCRIPT...`
    instead of `-m MODULE` (vLLM's console form takes the model as its positional: `vllm serve M`); its
    `extra_args` come last, verbatim. Flags come in catalog order, so two profiles
    with the same flags render the same argv: True booleans as "--flag", False ones not at all (or
    "--no-flag" for negatable vLLM flags), JSON flags as compact JSON.
    """
    if profile.backend == CUSTOM:
        return custom_argv(profile)
    if profile.script and profile.backend == "vllm":  # `vllm serve MODEL`: the model is its positional
        argv = [profile.python, *profile.script, profile.model, "--port", str(profile.port)]
    else:
        launcher = list(profile.script) if profile.script else ["-m", profile.module]
        argv = [profile.python, *launcher, f"--{MODEL_FLAG[profile.backend]}", profile.model,
                "--port", str(profile.port)]
    specs = catalog(profile.backend)
    unknown = [name for name in profile.flags if name not in specs]
    if unknown:
        raise ProfileError(f"{profile.source}: flags.{unknown[0]}: {unknown_flag_message(profile.backend, unknown[0])}")
    for name, spec in specs.items():
        if name in profile.flags:
            argv += render_flag(spec, profile.flags[name])
    return argv + list(profile.extra_args)


def substitute(template: str, profile: Profile) -> str:
    """One custom-profile template item with {port}, {model}, {python} and {profile_dir} filled in."""
    values = {"port": str(profile.port), "model": profile.model, "python": profile.python,
              "profile_dir": str(profile.source.parent.resolve())}
    return PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), template)


def custom_argv(profile: Profile) -> list[str]:
    """A custom profile's argv: its command with placeholders filled, then its free-form flags in order."""
    argv = [substitute(item, profile) for item in profile.command]
    for name, value in profile.flags.items():
        argv += render_flag(free_flag(name), value)
    return argv


def health_url(profile: Profile) -> str:
    """The URL that confirms the server ready: a custom profile's health_url, else http://127.0.0.1:PORT/health."""
    if profile.backend == CUSTOM:
        return substitute(profile.health_url, profile) if profile.health_url else ""
    return f"http://127.0.0.1:{profile.port}/health"


def launch_env(profile: Profile) -> dict[str, str]:
    """The profile's env plus CUDA_VISIBLE_DEVICES from `gpus` (unless env sets it or gpus is empty)."""
    env = dict(profile.env)
    if profile.gpus and "CUDA_VISIBLE_DEVICES" not in env:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in profile.gpus)
    return env


def flag_diff(old_flags: Mapping[str, FlagValue], new_flags: Mapping[str, FlagValue]) -> list[FlagChange]:
    """What changed from `old_flags` to `new_flags`, in the old order then the new flags' order.

    When a JSON flag is in both (or appears/disappears with a single key, as a toggle does it), its
    changed keys are reported one by one with dotted names ("speculative-config.num_speculative_tokens").
    """
    changes: list[FlagChange] = []
    for name in [*old_flags, *(n for n in new_flags if n not in old_flags)]:
        old, new = old_flags.get(name), new_flags.get(name)
        if old == new:
            continue
        before = old if isinstance(old, dict) else {} if old is None else None
        after = new if isinstance(new, dict) else {} if new is None else None
        if before is not None and after is not None and ((old is not None and new is not None)
                                                         or len(before) + len(after) == 1):
            for key in [*before, *(k for k in after if k not in before)]:
                if before.get(key) != after.get(key):
                    changes.append(FlagChange(f"{name}.{key}", before.get(key), after.get(key)))
        else:
            changes.append(FlagChange(name, old, new))
    return changes


def profile_diff(old: Profile, new: Profile) -> list[FlagChange]:
    """flag_diff of the whole command lines: the model and port first, then the flags."""
    changes = [FlagChange(f, a, b) for f, a, b in (
        (MODEL_FLAG[old.backend], old.model, new.model), ("port", old.port, new.port)) if a != b]
    return changes + flag_diff(old.flags, new.flags)


def describe_change(change: FlagChange, toggles: Sequence[Toggle] = ()) -> str:
    """One change for people: "steps 1 -> 3" when a one-flag toggle covers the flag, else "--flag old -> new".

    An absent boolean reads "off", an absent value with a toggle default reads as that default
    ("graphs FULL_AND_PIECEWISE -> NONE"), other absent values read "unset".
    """
    toggle = toggle_for_flag(toggles, change.flag)
    if toggle is not None and len(toggle.flags) == 1:
        label = toggle.label
    elif toggle is not None:
        label = f"{toggle.label}: --{change.flag}"
    else:
        label = f"--{change.flag}"
    boolean = isinstance(change.old, bool) or isinstance(change.new, bool)
    unset = "unset"
    if boolean:
        unset = "off"
    elif toggle is not None and toggle.defaults and len(toggle.flags) == 1:
        unset = format_value(toggle.defaults[0])
    old = unset if change.old is None else format_value(change.old)
    new = unset if change.new is None else format_value(change.new)
    return f"{label} {old} -> {new}"
