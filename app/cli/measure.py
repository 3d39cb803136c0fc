"""The measuring commands: `bench`, `ab`, `history`, `export`, `probe`, `advise` (registered by app.cli.main).

`probe` drives a running server with the continuous single-stream probe for a while and reports the tokens/s
each source saw at the same time: the probe client itself, the server's periodic log line (vLLM "Avg
generation throughput", SGLang "gen throughput"), and the /metrics counters, plus the speculative-decoding
acceptance from the counters' growth. Exit codes (app.cli.common): 2 also when no server runs to measure,
4 when an arm's server fails to start or no request finished, 130 cancelled (Ctrl-C; an A/B keeps its
finished trials in the history and prints what it has). Every bench and A/B lands in the history
(app.core.measure.store; $TUNEDASH_DATA_DIR overrides its folder).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from app.cli.ab_slots import run_ab_slots
from app.cli.common import (
    EXIT_OK,
    EXIT_START_FAILED,
    CliError,
    drive,
    exit_code,
    lifecycle_for,
    load_profile,
    open_host,
    say,
    with_take_over,
)
from app.core.advisor.advise import advice_text, advice_to_json, advise
from app.core.data import DecodeStats, SpecDecodeStats, ThroughputPoint
from app.core.errors import Reason
from app.core.flags.discovery import discover_flags
from app.core.hosts.base import Host
from app.core.logs.parser import LogParser
from app.core.measure.bench import BenchSpec, PromptFileError, build_prompts, summary_lines
from app.core.measure.client import RequestResult
from app.core.measure.experiment import (
    ARM_LABELS,
    Experiment,
    ExperimentFailed,
    ExperimentProgress,
    ExperimentSpec,
    parse_arm,
)
from app.core.measure.http_probes import check_health
from app.core.measure.metrics import MetricsPoller, MetricsRate, spec_decode_totals
from app.core.measure.probe import probe_loop
from app.core.measure.recorded import run_recorded_bench
from app.core.measure.report import bench_rows, experiment_text, export_run, text_table
from app.core.measure.slot_ab import SlotExperiment
from app.core.measure.store import HistoryStore, StoreError
from app.core.profiles.loading import resolve_profile
from app.core.profiles.render import launch_env
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.telemetry.energy import energy_meter_for


def _spec(profile: Profile, args: argparse.Namespace) -> BenchSpec:
    spec = BenchSpec.from_settings(
        profile.bench, requests=args.requests, concurrency=args.concurrency, input_len=args.input_len,
        max_tokens=args.max_tokens, warmup=args.warmup, prompt_file=args.prompt_file,
        endpoint="chat" if args.chat else None, seed=args.seed)
    for name in ("requests", "concurrency", "max_tokens"):
        if getattr(spec, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(spec, name)})")
    try:
        build_prompts(spec, 1)
    except PromptFileError as exc:
        raise CliError(str(exc)) from None
    return spec


def _store() -> HistoryStore:
    try:
        return HistoryStore()
    except StoreError as exc:
        raise CliError(str(exc)) from None


def _progress_printer(total: int, quiet: bool) -> Any:
    step = max(1, total // 8)

    def on_result(i: int, result: RequestResult) -> None:
        on_result.done += 1  # type: ignore[attr-defined]
        done = on_result.done  # type: ignore[attr-defined]
        if not quiet and (done % step == 0 or done == total):
            print(f"  {done}/{total} requests", file=sys.stderr, flush=True)

    on_result.done = 0  # type: ignore[attr-defined]
    return on_result


# ---- bench ---------------------------------------------------------------------------------------
async def cmd_bench(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    spec = _spec(profile, args)
    host = open_host(profile)
    base = await host.http_base(profile.port)
    health = await check_health(base)
    if not health.ok:
        raise CliError(
            f"no ready server of {profile.name} answers on port {profile.port} of {host.name} "
            f"({health.status or health.error}); start it with `tunedash launch {args.profile} --wait`",
            Reason.NOT_RUNNING)
    record = await jobs.load_job(host, profile)

    def follow_log(feed: Callable[[object], None]) -> Callable[[], None]:
        """The server's log from its end, parsed, into the acceptance meter (until the bench ends)."""
        if record is None or not record.log_path:
            return lambda: None
        task = asyncio.create_task(_follow(host, record.log_path, profile.backend, feed))

        def stop() -> None:
            task.cancel()

        return stop

    if not args.json:
        say(f"bench {profile.name} on {host.name}: {spec.requests} requests at concurrency {spec.concurrency}, "
            f"~{spec.input_len} input tokens, {spec.max_tokens} output tokens ({spec.warmup} warm-up)")
    with _store() as store:
        done = await run_recorded_bench(
            base, profile, spec, host_name=host.name, store=store, events=follow_log,
            running_flags=record.flags if record else profile.flags,
            on_result=_progress_printer(spec.requests, args.json), energy=energy_meter_for(host, profile))
    if args.json:
        say(json.dumps({"run_id": done.run_id, "profile": profile.name, "params": spec.to_json(), **done.summary},
                       indent=2))
    else:
        say(text_table(bench_rows(done.summary)))
        for line in summary_lines(done.summary):
            say(line)
        for warning in done.result.summary.warnings:
            say(f"warning: {warning}")
        say(f"history: run #{done.run_id} (`tunedash export {done.run_id} --format md`)")
    return EXIT_OK if done.result.summary.completed else EXIT_START_FAILED


async def _follow(host: Host, path: str, backend: str, feed: Callable[[object], None]) -> None:
    parser = LogParser(backend)
    async with contextlib.aclosing(host.follow(path, from_start=False)) as lines:
        async for line in lines:
            for event in parser.feed(line):
                feed(event)


# ---- ab ------------------------------------------------------------------------------------------
async def cmd_ab(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    texts = [args.a, args.b, *(args.arm or [])]
    if len(texts) > len(ARM_LABELS):
        raise CliError(f"at most {len(ARM_LABELS)} arms")
    arms = [parse_arm(profile, text, ARM_LABELS[i]) for i, text in enumerate(texts)]
    trials = args.trials if args.trials is not None else profile.bench.trials
    if trials < 1:
        raise CliError(f"--trials must be at least 1 (got {trials}); trials are per launch")
    launches = args.launches if args.launches is not None else profile.bench.launches
    if launches < 1:
        raise CliError(f"--launches must be at least 1 (got {launches}); 2 or more per arm give an interval")
    slots = args.slots if args.slots is not None else 1
    if slots not in (1, 2):
        raise CliError(f"--slots: ab runs on 1 slot or 2 side by side (got {slots}); `tunedash tune --slots N` "
                       "spreads more candidates")
    if slots == 2 and len(arms) != 2:
        raise CliError("--slots 2 runs A and B side by side: drop --arm (or run without --slots)")
    if slots == 2 and args.blocked:
        raise CliError("--slots 2 crosses A and B over the slots round by round; --blocked does not apply")
    spec = ExperimentSpec(arms, trials, _spec(profile, args), interleave=not args.blocked,
                          ready_timeout_s=args.ready_timeout, launches=launches, slots=slots)
    if slots == 2:
        return await run_ab_slots(profile, spec, args, _store, _report_ab)
    host = open_host(profile)
    quiet = args.json or args.md
    lifecycle = lifecycle_for(profile, host, argparse.Namespace(**{**vars(args), "json": quiet}))  # quiet: no narration
    # an arm whose flags the installed server rejects fails before its relaunch kills anything
    lifecycle.server_flags = await discover_flags(host, profile.backend, profile.python, profile.module,
                                                  launch_env(profile))
    await drive(lifecycle, args, "ab")

    def on_progress(p: ExperimentProgress) -> None:
        if quiet or p.kind in ("request", "done"):
            return
        say(f"[{p.trials_done}/{p.trials_total}] {p.text}")

    store = _store()
    experiment = Experiment(spec, lifecycle, store, on_progress=on_progress,
                            energy_for=lambda arm_profile: energy_meter_for(host, arm_profile))
    if not quiet:
        order = " ".join(ARM_LABELS[a] for a, _ in spec.launch_order())
        say(f"A/B on {profile.name} ({host.name}): {len(arms)} arms x {launches} launches x {trials} trials of "
            f"{spec.bench.requests} requests at concurrency {spec.bench.concurrency}; launch order {order}")
        for arm in arms:
            say(f"  {arm.label}: {arm.overrides or '(the profile as is)'}")
    code = EXIT_OK
    try:
        await experiment.run()
    except ExperimentFailed as exc:
        print(f"tunedash: {exc}", file=sys.stderr)
        code = exit_code(exc)
    except asyncio.CancelledError:
        _report_ab(experiment, args, store)
        print(f"cancelled: the {sum(len(a.values) for a in experiment.result.arms)} finished trials are kept in "
              f"history run #{experiment.run_id}", file=sys.stderr)
        store.close()
        raise
    finally:
        await lifecycle.close()
    _report_ab(experiment, args, store)
    store.close()
    return code


def _report_ab(experiment: Experiment, args: argparse.Namespace, store: HistoryStore) -> None:
    report = experiment.result.report()
    if args.json:
        say(json.dumps(report.to_json(), indent=2))
        return
    if args.md and experiment.run_id is not None:
        run = store.run(experiment.run_id)
        if run is not None:
            say(export_run(run, "md"))
            return
    say(experiment_text(report))
    last_idx = (experiment.last_on_slot0() if isinstance(experiment, SlotExperiment)
                else experiment.spec.schedule()[-1].arm)
    last = experiment.result.arms[last_idx] if experiment.result.status == "done" else None
    if last is not None:
        where = " on slot 0 (the profile's own GPUs and port)" if isinstance(experiment, SlotExperiment) else ""
        say(f"the server keeps running with arm {last.label} ({last.overrides or 'the profile as is'}){where}")
    say(f"history: run #{experiment.run_id} (`tunedash export {experiment.run_id} --format md`)")


# ---- history and export --------------------------------------------------------------------------
def _say_skipped(store: HistoryStore) -> None:
    """The rows a read skipped, on stderr (stdout stays the table or the JSON)."""
    note = store.skipped_note()
    if note:
        print(f"tunedash: {note}", file=sys.stderr)


def cmd_history(args: argparse.Namespace) -> int:
    with _store() as store:
        runs = store.runs(args.limit)
        _say_skipped(store)
        if args.json:
            say(json.dumps([{
                "id": r.id, "kind": r.kind, "profile": r.profile, "host": r.host, "backend": r.backend,
                "model": r.model, "started_at": r.started_at, "finished_at": r.finished_at,
                "status": r.shown_status, "trials": r.trial_count, "verdict": r.verdict,
                "summary": r.summary} for r in runs], indent=2))
            return EXIT_OK
        if not runs:
            say(f"no runs yet in {store.path}; `tunedash bench PROFILE` or `tunedash ab PROFILE ...` adds some")
            return EXIT_OK
        rows = [["id", "when", "kind", "profile", "status", "trials", "result"]]
        for r in runs:
            result = r.verdict or _bench_line(r.summary) or ""
            rows.append([str(r.id), time.strftime("%m-%d %H:%M", time.localtime(r.started_at)), r.kind, r.profile,
                         r.shown_status, str(r.trial_count), result[:90]])
        say(text_table(rows))
    return EXIT_OK


def _bench_line(summary: dict[str, Any] | None) -> str:
    if not summary or summary.get("output_tok_s") is None:
        return ""
    accept = summary.get("accept_len")
    return f"{summary['output_tok_s']:.1f} tok/s" + (f", accept {accept:.2f}" if accept is not None else "")


def cmd_export(args: argparse.Namespace) -> int:
    with _store() as store:
        try:
            run = store.run(args.id)
        except StoreError as exc:
            raise CliError(str(exc)) from None
        if run is None:
            raise CliError(f"no run #{args.id} in {store.path}; `tunedash history` lists the runs")
        if run.kind == "tune":  # a tune run's own tables and plots (app.core.tune.export)
            from app.core.tune.export import export_tune

            text = export_tune(run, args.format)
        elif args.format == "svg":
            from app.tui.compare import compare_svg  # the screen's own screenshot; loads Textual only here

            text = asyncio.run(compare_svg(run, store.request_rows(run.id)))
        else:
            text = export_run(run, args.format)
        _say_skipped(store)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise CliError(f"{args.output}: cannot write the export ({exc.strerror or exc})") from None
        say(f"run #{args.id} written to {args.output}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


# ---- probe ---------------------------------------------------------------------------------------
def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


async def cmd_probe(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    host = open_host(profile)
    record = await jobs.load_job(host, profile)
    if record is None or not await jobs.job_members(host, record):
        raise CliError(f"{profile.name}: no server of this profile is running on {host.name}; "
                       f"start it with `tunedash launch {args.profile} --wait`", Reason.NOT_RUNNING)
    base = await host.http_base(record.port)  # an SSH host forwards the port
    probe_points: list[ThroughputPoint] = []
    errors: list[str] = []
    log_stats: list[DecodeStats] = []
    spec_lines: list[SpecDecodeStats] = []
    rates: list[MetricsRate] = []

    def sort_event(event: object) -> None:
        if isinstance(event, DecodeStats):
            log_stats.append(event)
        elif isinstance(event, SpecDecodeStats):
            spec_lines.append(event)

    poller = MetricsPoller(base, record.backend, period_s=args.metrics_period)
    before = await poller.read()
    tasks = [
        asyncio.create_task(_follow(host, record.log_path, record.backend, sort_event)),
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
        say(json.dumps(data, indent=2))
    else:
        say(f"probe:   {_fmt(data['probe']['median_tps'])} tok/s (median of {len(probe_points)} requests)")
        say(f"log:     {_fmt(data['log']['median_tps'])} tok/s (median of {len(log_stats)} throughput lines)")
        say(f"metrics: {_fmt(data['metrics']['median_tps'])} tok/s (median of {len(busy)} busy "
               f"{args.metrics_period:g} s windows)")
        if spec is not None:
            say(f"spec decode: {spec.accepted:.0f} of {spec.draft_tokens:.0f} draft tokens accepted, "
                   f"acceptance length {_fmt(spec.accept_len)}")
    if not probe_points:
        print(f"tunedash probe: no request finished: {errors[0] if errors else 'no answer'}", file=sys.stderr)
        return EXIT_START_FAILED
    return EXIT_OK


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


# ---- advise --------------------------------------------------------------------------------------
async def cmd_advise(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    against = resolve_profile(args.against) if args.against else None
    host = open_host(profile)
    with _store() as store:
        advice = await advise(host, profile, store=store, against=against)
    say(json.dumps(advice_to_json(advice), indent=2) if args.json else advice_text(advice))
    return EXIT_OK


# ---- registration --------------------------------------------------------------------------------
def _bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, help="requests per run/trial (default: the profile's [bench])")
    p.add_argument("--concurrency", type=int, help="requests in flight")
    p.add_argument("--input-len", type=int, help="prompt length in tokens (synthetic prompts)")
    p.add_argument("--max-tokens", type=int, help="output tokens per request (ignore_eos)")
    p.add_argument("--warmup", type=int, help="warm-up requests, not counted")
    p.add_argument("--prompt-file", type=_path, help="prompts, one per line (instead of synthetic ones)")
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    p.add_argument("--seed", type=int, help="seed of the synthetic prompts")


def _path(text: str) -> Any:
    from pathlib import Path

    return Path(text).expanduser()


def register(sub: Any, with_overrides: Any) -> None:
    """Add bench, ab, history, export, probe and advise to the `tunedash` subparsers."""
    p = sub.add_parser("bench", help="benchmark the running server: N requests at concurrency C")
    p.add_argument("profile")
    _bench_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("ab", help="A/B: launches x trials per arm, B/A with a 95%% interval from the launches")
    p.add_argument("profile")
    with_overrides(p)
    p.add_argument("--a", required=True, metavar='"F=V ..."', help="arm A's flag overrides ('' = the profile)")
    p.add_argument("--b", required=True, metavar='"F=V ..."', help="arm B's flag overrides (!F unsets F)")
    p.add_argument("--arm", action="append", metavar='"F=V ..."', help="more arms (C, D, ...), each against A")
    p.add_argument("--launches", type=int,
                   help="launches per arm, the unit of the interval (default: the profile's [bench] launches, 2)")
    p.add_argument("--trials", type=int, help="trials per launch (default: the profile's [bench] trials)")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--interleave", dest="blocked", action="store_false", default=False,
                       help="launches in the order A B B A A B ... so drift cancels (the default)")
    order.add_argument("--blocked", dest="blocked", action="store_true",
                       help="every launch of A, then every launch of B")
    p.add_argument("--slots", type=int, metavar="N",
                   help="2: run A and B side by side on two disjoint GPU sets, crossed over (round r: A on slot r%%2, "
                        "B on the other), and report the slot effect; 1 (default): one server, arm after arm")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for each arm's server")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for free GPUs between arms")
    p.add_argument("--grace", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL")
    with_take_over(p)
    _bench_options(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--md", action="store_true", help="Markdown ready for a pull request")
    p.set_defaults(func=cmd_ab)

    p = sub.add_parser("history", help="past benchmark and A/B runs")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("export", help="one run as Markdown (for a PR), CSV (per trial), JSON, or SVG (the "
                       "compare screen with its plots, 120x40)")
    p.add_argument("id", type=int)
    p.add_argument("--format", choices=["md", "csv", "json", "svg"], default="md")
    p.add_argument("-o", "--output", help="write to a file instead of stdout")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("probe", help="probe the running server; tok/s from the probe, the log and /metrics")
    p.add_argument("profile")
    p.add_argument("--seconds", type=float, default=20.0, help="how long to probe")
    p.add_argument("--log-wait", type=float, default=15.0,
                   help="extra seconds to wait for the server's first throughput log line")
    p.add_argument("--max-tokens", type=int, default=96, help="output tokens per probe request")
    p.add_argument("--metrics-period", type=float, default=2.0, help="seconds between /metrics scrapes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("advise", help="what the running server leaves on the table, and why it is slower than before")
    p.add_argument("profile")
    p.add_argument("--against", metavar="PROFILE", help="also diff the running flags against this profile")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_advise)
