"""What the running server itself reports, gathered for the advisor's rules: `Evidence` and `gather_evidence`.

Every source is optional: an unanswered /get_server_info, an older server without a field, a value that reads
`[N/A]`, an unreadable log or GPU snapshot all become None (or an empty tuple), and the rules then claim
nothing from them (docs/architecture.md, the advisor).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.data import DecodeStats, FlagValue, GpuSample, LogLine, Notice, PhaseEvent, SpecDecodeStats
from app.core.flags.values import get_flag
from app.core.hosts.base import Host, HostError
from app.core.logs.parser import parse_lines, vllm_engine_config
from app.core.measure.http_probes import get_json, server_info
from app.core.server.jobs import JobRecord
from app.core.telemetry.pagecache import PageCache, read_page_cache
from app.core.telemetry.smi import telemetry_for
from app.core.telemetry.topology import GpuFacts, read_gpu_facts

UNREADABLE = frozenset({"", "[N/A]", "N/A", "[Not Supported]", "None", "null"})
"""Text values that mean "not read", from nvidia-smi or a server that prints a placeholder."""


@dataclass(frozen=True)
class Evidence:
    """The server in front of the advisor, as it reports itself. None / () = not read."""

    backend: str
    requested: Mapping[str, FlagValue]  # the flags it was launched with (the job record's)
    version: str | None = None  # the release, from /get_server_info (or /version)
    resolved: Mapping[str, Any] | None = None  # /get_server_info: the args after the server's own rules
    model_info: Mapping[str, Any] | None = None  # SGLang's /model_info: architectures, has_image_understanding
    engine: Mapping[str, str] = field(default_factory=dict)  # vLLM's engine-config line (logs.parser)
    engine_line: LogLine | None = None
    notices: tuple[Notice, ...] = ()
    decode: tuple[DecodeStats, ...] = ()
    spec_decode: tuple[SpecDecodeStats, ...] = ()
    phases: tuple[PhaseEvent, ...] = ()
    log_lines: int | None = None  # None: the log was not read
    gpus: tuple[GpuSample, ...] = ()
    gpu_facts: GpuFacts | None = None  # compute capability and interconnect (app.core.telemetry.topology)
    page_cache: PageCache | None = None  # the model's weight files in the host's page cache (telemetry.pagecache)
    problems: tuple[str, ...] = field(default=())  # sources that could not be read, for people

    def field(self, name: str) -> Any:
        """One resolved server arg, or None when the server did not report it (or reported a placeholder)."""
        if self.resolved is None:
            return None
        value = self.resolved.get(name)
        if value is None and isinstance(self.resolved.get("internal_states"), list):
            states = self.resolved["internal_states"]
            if states and isinstance(states[0], dict):
                value = states[0].get(name)
        if isinstance(value, str) and value.strip() in UNREADABLE:
            return None
        return value

    def flag(self, name: str) -> FlagValue | None:
        """A requested flag's value (None: absent from the launch)."""
        return get_flag(self.requested, name)

    def number(self, field_name: str, flag_name: str = "") -> tuple[float | None, str]:
        """A number from the resolved args (preferred) or the requested flags, with where it came from."""
        value = self.field(field_name)
        if _is_number(value):
            return float(value), f"/get_server_info {field_name}={value}"
        requested = self.flag(flag_name) if flag_name else None
        if _is_number(requested):
            return float(requested), f"argv --{flag_name} {requested}"  # type: ignore[arg-type]
        return None, ""

    @property
    def tp_size(self) -> tuple[int, str]:
        """The tensor-parallel size and where it came from (an absent flag: SGLang's and vLLM's default, 1)."""
        flag = "tp-size" if self.backend == "sglang" else "tensor-parallel-size"
        value, source = self.number("tp_size", flag)
        if value is None:
            return 1, f"argv: no --{flag} (default 1)"
        return int(value), source


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


async def gather_evidence(host: Host, record: JobRecord) -> Evidence:
    """Ask the running server (its HTTP API, its log on the host, the GPUs) what it runs; never raises for a
    source that does not answer: that source stays None and is named in `problems`."""
    problems: list[str] = []
    info: dict[str, Any] | None = None
    try:
        base = await host.http_base(record.port)
        info = await server_info(base, record.backend)
    except (HostError, OSError) as exc:
        problems.append(f"server info: {exc}")
    if info is None:
        problems.append("server info: no answer from /get_server_info" if record.backend == "sglang"
                        else "server info: no answer from /version")
    version = info.get("version") if info else None
    resolved = info if info is not None and record.backend == "sglang" else None
    model_info: dict[str, Any] | None = None
    if resolved is not None:
        with contextlib.suppress(HostError, OSError):
            model_info = await get_json(base, "/model_info") or await get_json(base, "/get_model_info")
    lines: list[str] | None = None
    if record.log_path:  # its window (first and last MiBs: app.core.hosts.window), never the whole log
        with contextlib.suppress(HostError, OSError):
            window = await host.read_window(record.log_path)
            lines = list(window.lines) if window is not None else None
    if lines is None:
        problems.append(f"log: {record.log_path or 'no log path'} not readable")
    # parsed in a thread, never on the dashboard's event loop
    parsed = await asyncio.to_thread(parse_lines, lines, record.backend) if lines is not None else None
    engine, engine_line = ({}, None) if lines is None or record.backend != "vllm" else await asyncio.to_thread(
        vllm_engine_config, lines)
    events = parsed.events if parsed is not None else ()
    gpus: tuple[GpuSample, ...] = ()
    telemetry = telemetry_for(host, "smi", tuple(record.gpus))
    try:
        snapshot = await telemetry.sample()
        if snapshot.error is None:
            gpus = snapshot.gpus
        else:
            problems.append(f"nvidia-smi: {snapshot.error.message}")
    finally:
        await telemetry.close()
    page_cache = await read_page_cache(host, record.model)  # a model that is not a folder: its reason, no problem
    gpu_facts = await read_gpu_facts(host, record.gpus)
    problems += [f"gpu facts: {e}" for e in (gpu_facts.capability_error, gpu_facts.topology_error) if e]
    return Evidence(
        backend=record.backend, requested=dict(record.flags),
        version=version if isinstance(version, str) and version else None, resolved=resolved,
        model_info=model_info, engine=engine, engine_line=engine_line,
        notices=tuple(e for e in events if isinstance(e, Notice)),
        decode=tuple(e for e in events if isinstance(e, DecodeStats)),
        spec_decode=tuple(e for e in events if isinstance(e, SpecDecodeStats)),
        phases=tuple(e for e in events if isinstance(e, PhaseEvent)),
        log_lines=parsed.lines if parsed is not None else None,
        gpus=gpus, gpu_facts=gpu_facts, page_cache=page_cache, problems=tuple(problems),
    )
