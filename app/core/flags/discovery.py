"""Version discovery: which launch flags the installed server accepts, from its own `--help`, cached.

Why: the flag catalog (app.core.flags.catalog) spans many releases; a flag added in vLLM 0.33 makes 0.32
exit at argument parsing. The server itself is the only authority, so we ask it once per interpreter:

1. A fingerprint of the installed package, cheap (no import of the server): one `python -c` that prints
   the distribution's version and the mtime of the package folder (FINGERPRINT_SCRIPT). A reinstall or an
   upgrade changes it.
2. `python -m MODULE --help` (vLLM's grouped help: `--help=all` first, then plain `--help`), parsed for
   its option names (`--max-model-len`, `--no-enable-prefix-caching`, `-tp`...). Importing vLLM takes
   10-60 s on a small machine, hence the cache.
3. The result is cached on the host as JSON under `<state_dir>/discovery/<key>.json` (key: backend,
   python, module, fingerprint), and in memory for this process. A later call with the same fingerprint
   reads the file and runs nothing but the fingerprint script.

Both SGLang and vLLM are asked (DISCOVERABLE_BACKENDS): SGLang renamed and removed flags between 0.5.10 and
0.5.23, so its toggles render the flags of the version found (app.core.flags.toggles). The version comes from
the package metadata when the module belongs to the backend's own distribution (`sglang`, `vllm`: nothing
imported); otherwise (the simulated server, `app.sim.sglang`) from the `__version__` of the package above the
module (`app.sim`), which is what `python -c 'import sglang; print(sglang.__version__)'` prints for the real
one. It is part of the cache key, so a new version (or a simulated host switched to another version) is asked
again.

A server that cannot be asked (python missing, the import fails, timeout) gives ServerFlags with
`flags=None` and the reason: callers then fall back to the whole catalog and say so. Nothing raises.
spec_accepted, offered_catalog and rejected_flags hold the catalog against what the server accepts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from app.core.flags.catalog import FlagSpec, FlagValue
from app.core.flags.values import catalog
from app.core.hosts.base import Host, HostError

DISCOVERABLE_BACKENDS = ("vllm", "sglang")
HELP_ARGS = {"vllm": ("--help=all", "--help"), "sglang": ("--help",)}  # vLLM groups its help
HELP_TIMEOUT_S = 300.0
FINGERPRINT_TIMEOUT_S = 60.0
CACHE_FORMAT = 2  # 2: flags may hold IPC_CACHE_FORMAT
IPC_CACHE_FORMAT = "load-format=ipc_cache"  # vLLM's help names the ipc_cache load format (warm mode)

# Run as `python -c SCRIPT PACKAGE BACKEND MODULE`: prints {"version", "mtime", "origin", "distribution"}.
# The package is not imported when it is the backend's own distribution (its metadata has the version);
# otherwise the packages above MODULE are imported for a __version__ (a stand-in server such as the simulator,
# whose app.sim package says which SGLang it plays); MODULE itself never is (importing a server may start it).
FINGERPRINT_SCRIPT = r"""
import importlib, importlib.metadata as md, importlib.util as iu, json, os, sys
pkg, backend, module = sys.argv[1], sys.argv[2], sys.argv[3]
out = {"version": None, "mtime": None, "origin": None, "distribution": None}
spec = iu.find_spec(pkg)
if spec is not None and spec.origin:
    folder = os.path.dirname(spec.origin)
    out["origin"] = folder
    out["mtime"] = os.stat(folder).st_mtime_ns
for dist in md.packages_distributions().get(pkg, []) + [pkg]:
    try:
        out["version"] = md.version(dist)
        out["distribution"] = dist
        break
    except md.PackageNotFoundError:
        pass
if out["origin"] and (out["distribution"] or "").lower().replace("_", "-") not in (backend, backend + "-cpu"):
    out["version"] = None
    parts = module.split(".")
    for depth in range(len(parts) - 1, 0, -1):  # the server module's packages, deepest first; never the module
        try:
            found = getattr(importlib.import_module(".".join(parts[:depth])), "__version__", None)
        except Exception as exc:
            out["import_error"] = repr(exc)[:200]
            break
        if found is not None:
            out["version"] = str(found)
            break
print(json.dumps(out))
"""

# An argparse invocation line: two spaces, then "-x, --long ARG" or "--long", help after two spaces.
_OPTION_LINE = re.compile(r"^ {1,8}(-[^\s].*?)(?: {2,}|$)")
_OPTION_NAME = re.compile(r"^--?([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class ServerFlags:
    """What one installed server accepts. `flags` holds option names without dashes; None = unknown."""

    backend: str
    python: str
    module: str
    version: str | None
    flags: frozenset[str] | None
    reason: str = ""  # why flags is None, or "" when they were read
    cached: bool = False  # read from the cache file rather than from a fresh `--help`

    @property
    def known(self) -> bool:
        return self.flags is not None

    def accepts(self, spec: FlagSpec) -> bool | None:
        """Whether the server takes `spec` (by its name or an alias); None when the flags are unknown."""
        return spec_accepted(spec, self.flags)

    def describe(self) -> str:
        """"vLLM 0.32.0 (/path/python)" for messages."""
        nice = {"vllm": "vLLM", "sglang": "SGLang"}.get(self.backend, self.backend)
        return f"{nice} {self.version or '(version unknown)'} ({self.python})"

    def to_json(self) -> dict[str, object]:
        return {"format": CACHE_FORMAT, "backend": self.backend, "python": self.python, "module": self.module,
                "version": self.version, "flags": sorted(self.flags) if self.flags is not None else None,
                "reason": self.reason}


def spec_accepted(spec: FlagSpec, accepted: AbstractSet[str] | None) -> bool | None:
    """Whether a server whose --help lists `accepted` (names without dashes) takes `spec`; None = unknown."""
    if accepted is None:
        return None
    return any(name in accepted for name in (spec.name, *spec.aliases))


def offered_catalog(backend: str, accepted: AbstractSet[str] | None) -> dict[str, FlagSpec]:
    """The catalog without the flags the installed server rejects (all of it when `accepted` is None)."""
    return {name: spec for name, spec in catalog(backend).items() if spec_accepted(spec, accepted) is not False}


def rejected_flags(backend: str, flags: Mapping[str, FlagValue], accepted: AbstractSet[str] | None) -> list[str]:
    """The names in `flags` that the installed server would reject at argument parsing (none when unknown)."""
    specs = catalog(backend)
    return [name for name in flags if name in specs and spec_accepted(specs[name], accepted) is False]


def parse_help_flags(text: str) -> frozenset[str]:
    """Option names of an argparse `--help` text, without dashes ("max-model-len", "no-enable-prefix-caching")."""
    names: set[str] = set()
    for line in text.splitlines():
        match = _OPTION_LINE.match(line)
        if not match:
            continue
        for part in match.group(1).split(", "):
            name = _OPTION_NAME.match(part.strip())
            if name:
                names.add(name.group(1))
    names.discard("h")
    names.discard("help")
    if '"ipc_cache"' in text:  # vLLM 0.32+: `--load-format ipc_cache` (and `vllm preload`): a choice, not a flag
        names.add(IPC_CACHE_FORMAT)
    return frozenset(names)


_memory: dict[str, ServerFlags] = {}


def _cache_key(backend: str, python: str, module: str, fingerprint: dict[str, object]) -> str:
    raw = json.dumps([backend, python, module, fingerprint], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


async def _fingerprint(host: Host, backend: str, python: str, module: str,
                       env: dict[str, str]) -> dict[str, object] | str:
    """The package's version/mtime, or the reason it could not be read."""
    package = module.split(".")[0]
    try:
        result = await host.run([python, "-c", FINGERPRINT_SCRIPT, package, backend, module],
                                timeout=FINGERPRINT_TIMEOUT_S, env=env)
    except HostError as exc:
        return str(exc)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        return f"{python} could not run on {host.name}: {last}"
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"{python}: unexpected answer {result.stdout[:120]!r}"
    if not isinstance(data, dict) or data.get("origin") is None:
        return f"{python} on {host.name} has no module {package!r} installed"
    return data


async def server_version(host: Host, backend: str, python: str, module: str,
                         env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """The installed server's version as `python` sees it (the fingerprint: nothing of the server is run), and
    why it is None when it is."""
    fingerprint = await _fingerprint(host, backend, python, module, dict(env or {}))
    if isinstance(fingerprint, str):
        return None, fingerprint
    version = fingerprint.get("version")
    return (str(version), "") if version is not None else (None, f"{python}: no version found for {module}")


async def _ask_help(host: Host, backend: str, python: str, module: str,
                    env: dict[str, str]) -> tuple[frozenset[str] | None, str]:
    last_error = ""
    for help_arg in HELP_ARGS.get(backend, ("--help",)):
        try:
            result = await host.run([python, "-m", module, help_arg], timeout=HELP_TIMEOUT_S, env=env)
        except HostError as exc:
            return None, str(exc)
        flags = parse_help_flags(result.stdout)
        if result.returncode == 0 and flags:
            return flags, ""
        tail = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        last_error = f"`{python} -m {module} {help_arg}` failed on {host.name}: {tail}"
    return None, last_error


async def discover_flags(
    host: Host, backend: str, python: str, module: str, env: dict[str, str] | None = None, *, refresh: bool = False
) -> ServerFlags:
    """The flags the server at `python -m module` accepts (module docstring). Never raises."""
    if backend not in DISCOVERABLE_BACKENDS:
        return ServerFlags(backend, python, module, None, None, f"flag discovery is not enabled for {backend}")
    fingerprint = await _fingerprint(host, backend, python, module, dict(env or {}))
    if isinstance(fingerprint, str):
        return ServerFlags(backend, python, module, None, None, fingerprint)
    version = fingerprint.get("version")
    version_text = str(version) if version is not None else None
    key = _cache_key(backend, python, module, {k: fingerprint.get(k) for k in ("version", "mtime", "origin")})
    path = f"{host.state_dir}/discovery/{key}.json"
    if not refresh:
        if key in _memory:
            return _memory[key]
        cached = await _read_cache(host, path)
        if cached is not None:
            _memory[key] = cached
            return cached
    flags, reason = await _ask_help(host, backend, python, module, dict(env or {}))
    found = ServerFlags(backend, python, module, version_text, flags, reason)
    if flags is not None:
        _memory[key] = found
        try:
            await host.write_text(path, json.dumps(found.to_json(), indent=1) + "\n")
        except (HostError, OSError):
            pass  # the answer is still good; the next process asks again
    return found


async def _read_cache(host: Host, path: str) -> ServerFlags | None:
    try:
        text = await host.read_text(path)
    except (HostError, OSError):
        return None
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("flags"), list):
        return None
    return ServerFlags(str(data["backend"]), str(data["python"]), str(data["module"]),
                       data.get("version"), frozenset(str(f) for f in data["flags"]), cached=True)


def rejection_message(found: ServerFlags, flags: Mapping[str, FlagValue], source: str) -> str | None:
    """Why a launch with `flags` would fail at the server's argument parsing, naming each rejected flag, the
    version and what replaces it when the catalog knows; None when every flag is accepted (or unknown)."""
    rejected = rejected_flags(found.backend, flags, found.flags)
    if not rejected:
        return None
    specs = catalog(found.backend)
    parts = []
    for name in rejected:
        instead = specs[name].replacement()
        parts.append(f"--{name}" + (f" (use {instead} instead)" if instead else ""))
    return (f"{source}: the installed {found.describe()} does not accept {', '.join(parts)}; change the profile "
            f"(or --unset {rejected[0]}); nothing was launched or killed")
