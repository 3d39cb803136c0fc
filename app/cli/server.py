"""`tunedash flags` (what the installed server accepts) and `tunedash probe` (tok/s from probe, log, /metrics).

Both talk to the real server of a profile: `flags` asks its interpreter (`python -m MODULE --help`,
cached: app.core.flags.discovery); `probe` drives a running server with the continuous single-stream probe for
a while and reports the tokens/s each source saw at the same time: the probe client itself, the server's
periodic log line (vLLM "Avg generation throughput", SGLang "gen throughput"), and the /metrics counters
(vLLM vllm:generation_tokens_total), plus the speculative-decoding acceptance from the counters' growth.
Registered in app.cli.main by `register`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
from typing import Any

from app.connect import host_for
from app.core.data import DecodeStats, SpecDecodeStats, ThroughputPoint
from app.core.flags.discovery import discover_flags
from app.core.flags.rules import catalog, spec_accepted
from app.core.hosts.base import Host
from app.core.logs.parser import LogParser
from app.core.measure.loadgen import probe_loop
from app.core.measure.metrics import MetricsPoller, MetricsRate, spec_decode_totals
from app.core.profiles.loading import Profile, ProfileError, apply_overrides, launch_env, resolve_profile
from app.core.server import jobs

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_NO_TOKENS = 4


def _load(args: argparse.Namespace) -> Profile:
    profile = resolve_profile(args.profile)
    if getattr(args, "set", None) or getattr(args, "unset", None):
        profile = apply_overrides(profile, args.set or [], args.unset or [])
    return profile


def _print(text: str) -> None:
    print(text, flush=True)


# ---- flags ---------------------------------------------------------------------------------------
async def cmd_flags(args: argparse.Namespace) -> int:
    profile = _load(args)
    host = host_for(profile)
    found = await discover_flags(host, profile.backend, profile.python, profile.module, launch_env(profile),
                                 refresh=args.refresh)
    specs = catalog(profile.backend)
    offered = [name for name, spec in specs.items() if spec_accepted(spec, found.flags) is not False]
    rejected = [name for name in specs if name not in offered]
    in_profile = [name for name in profile.flags if name in rejected]
    data: dict[str, Any] = {
        "backend": profile.backend, "python": found.python, "module": found.module, "version": found.version,
        "known": found.known, "reason": found.reason or None, "cached": found.cached,
        "server_flags": len(found.flags) if found.flags is not None else None,
        "offered": offered, "rejected": rejected, "rejected_in_profile": in_profile,
    }
    if args.json:
        _print(json.dumps(data, indent=2))
    elif not found.known:
        _print(f"{profile.name}: the installed server's flags are unknown: {found.reason}")
        _print(f"  the whole {profile.backend} catalog is offered ({len(specs)} flags)")
    else:
        _print(f"{profile.name}: {found.describe()}: {len(found.flags or ())} flags in its --help"
               f"{' (cached)' if found.cached else ''}")
        _print(f"  catalog: {len(offered)} offered, {len(rejected)} not accepted by this version"
               + (": " + ", ".join(f"--{n}" for n in rejected) if rejected else ""))
        for name in in_profile:
            _print(f"  {profile.source}: flags.{name}: not accepted by this version; remove it")
    return EXIT_BAD_INPUT if in_profile else EXIT_OK


async def refuse_rejected_flags(profile: Profile, host: Host) -> None:
    """Raise ProfileError when the profile sets a flag the installed server rejects (unknown: let it pass)."""
    found = await discover_flags(host, profile.backend, profile.python, profile.module, launch_env(profile))
    specs = catalog(profile.backend)
    for name in profile.flags:
        if name in specs and found.accepts(specs[name]) is False:
            raise ProfileError(f"{profile.source}: flags.{name}: the installed {found.describe()} does not accept "
                               f"--{name}; remove it from the profile (or --unset {name})")


# ---- probe ---------------------------------------------------------------------------------------
def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


async def cmd_probe(args: argparse.Namespace) -> int:
    profile = _load(args)
    host = host_for(profile)
    record = await jobs.load_job(host, profile.name)
    if record is None or not await jobs.job_members(host, record):
        raise ProfileError(f"{profile.name}: no server of this profile is running on {host.name}; "
                           f"start it with `tunedash launch {args.profile} --wait`")
    base = await host.http_base(record.port)  # an SSH host forwards the port
    probe_points: list[ThroughputPoint] = []
    errors: list[str] = []
    log_stats: list[DecodeStats] = []
    spec_lines: list[SpecDecodeStats] = []
    rates: list[MetricsRate] = []

    async def follow_log() -> None:
        parser = LogParser(record.backend)
        async with contextlib.aclosing(host.follow(record.log_path, from_start=False)) as lines:
            async for line in lines:
                for event in parser.feed(line):
                    if isinstance(event, DecodeStats):
                        log_stats.append(event)
                    elif isinstance(event, SpecDecodeStats):
                        spec_lines.append(event)

    poller = MetricsPoller(base, record.backend, period_s=args.metrics_period)
    before = await poller.read()
    tasks = [
        asyncio.create_task(follow_log()),
        asyncio.create_task(poller.run(rates.append)),
        asyncio.create_task(probe_loop(base, record.model, probe_points.append, errors.append,
                                       max_tokens=args.max_tokens)),
    ]
    try:
        await asyncio.sleep(args.seconds)
        # The log line comes every ~10 s while busy: wait a little longer for one if none came yet.
        extra = 0.0
        while not log_stats and extra < args.log_wait:
            await asyncio.sleep(0.5)
            extra += 0.5
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    after = await poller.read()
    spec = spec_decode_totals(before.values, after.values, record.backend) if before and after else None
    busy = [r.tokens_per_s for r in rates if r.tokens > 0]
    data: dict[str, Any] = {
        "profile": profile.name,
        "probe": {"requests": len(probe_points), "median_tps": _median([p.tokens_per_s for p in probe_points]),
                  "errors": errors[:5]},
        "log": {"lines": len(log_stats), "median_tps": _median([s.gen_tps for s in log_stats]),
                "last_tps": log_stats[-1].gen_tps if log_stats else None},
        "metrics": {"windows": len(rates), "busy_windows": len(busy), "median_tps": _median(busy),
                    "answered": before is not None},
        "spec_decode": None if spec is None else {
            "accepted": spec.accepted, "drafts": spec.drafts, "draft_tokens": spec.draft_tokens,
            "accept_len": None if spec.accept_len is None else round(spec.accept_len, 3),
            "accept_rate": None if spec.accept_rate is None else round(spec.accept_rate, 4)},
        "spec_decode_log": None if not spec_lines else {
            "lines": len(spec_lines), "mean_accept_len": spec_lines[-1].mean_accept_len,
            "accept_rate": spec_lines[-1].accept_rate},
    }
    if args.json:
        _print(json.dumps(data, indent=2))
    else:
        _print(f"probe:   {_fmt(data['probe']['median_tps'])} tok/s (median of {len(probe_points)} requests)")
        _print(f"log:     {_fmt(data['log']['median_tps'])} tok/s (median of {len(log_stats)} throughput lines)")
        _print(f"metrics: {_fmt(data['metrics']['median_tps'])} tok/s (median of {len(busy)} busy "
               f"{args.metrics_period:g} s windows)")
        if spec is not None:
            _print(f"spec decode: {spec.accepted:.0f} of {spec.draft_tokens:.0f} draft tokens accepted, "
                   f"acceptance length {_fmt(spec.accept_len)}")
    if not probe_points:
        print(f"tunedash probe: no request finished: {errors[0] if errors else 'no answer'}", file=sys.stderr)
        return EXIT_NO_TOKENS
    return EXIT_OK


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


# ---- registration --------------------------------------------------------------------------------
def register(sub: Any) -> None:
    """Add `flags` and `probe` to the `tunedash` subcommands (app.cli.main calls this)."""
    p = sub.add_parser("flags", help="which catalog flags the installed server accepts (from its --help)")
    p.add_argument("profile")
    p.add_argument("--refresh", action="store_true", help="ask the server again instead of the cache")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_flags)

    p = sub.add_parser("probe", help="probe the running server; tok/s from the probe, the log and /metrics")
    p.add_argument("profile")
    p.add_argument("--seconds", type=float, default=20.0, help="how long to probe")
    p.add_argument("--log-wait", type=float, default=15.0,
                   help="extra seconds to wait for the server's first throughput log line")
    p.add_argument("--max-tokens", type=int, default=96, help="output tokens per probe request")
    p.add_argument("--metrics-period", type=float, default=2.0, help="seconds between /metrics scrapes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_probe)
