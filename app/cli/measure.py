"""The measuring commands: `bench`, `ab`, `history`, `export` (registered by app.cli.main.build_parser).

Exit codes (as app.cli.main): 0 done, 2 bad input (profile, arm, prompt file, unknown run id), 3 GPUs stay
held between arms, 4 no ready server to benchmark / an arm's server failed to start, 130 cancelled
(Ctrl-C; an A/B keeps its finished trials in the history and prints what it has). Every run lands in
the history (app.core.measure.store; $TUNEDASH_DATA_DIR overrides its folder).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from app.cli.main import EXIT_BAD_INPUT, EXIT_OK, EXIT_START_FAILED, CliError, _lifecycle, _load, _print
from app.connect import host_for
from app.core.logs.parser import LogParser
from app.core.measure.experiment import (
    ARM_LABELS,
    Experiment,
    ExperimentFailed,
    ExperimentProgress,
    ExperimentSpec,
    parse_arm,
)
from app.core.measure.http_probes import check_health
from app.core.measure.loadgen import (
    AcceptanceMeter,
    BenchSpec,
    PromptFileError,
    RequestResult,
    build_prompts,
    run_bench,
)
from app.core.measure.report import bench_rows, experiment_text, export_run, text_table
from app.core.measure.store import HistoryStore, StoreError
from app.core.profiles.loading import Profile
from app.core.server import jobs


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
    profile = _load(args)
    spec = _spec(profile, args)
    host = host_for(profile)
    base = await host.http_base(profile.port)
    health = await check_health(base)
    if not health.ok:
        raise CliError(
            f"no ready server of {profile.name} answers on port {profile.port} of {host.name} "
            f"({health.status or health.error}); start it with `tunedash launch {args.profile} --wait`",
            EXIT_START_FAILED)
    record = await jobs.load_job(host, profile.name)
    flags = dict(record.flags) if record else dict(profile.flags)
    meter = AcceptanceMeter(profile.backend, base)
    follower = None
    if record is not None and record.log_path:
        follower = asyncio.create_task(_follow(host, record.log_path, profile.backend, meter))
    store = _store()
    run_id = store.start_run("bench", profile=profile.name, host=host.name, backend=profile.backend,
                             model=profile.model, params={"bench": spec.to_json(), "trials": 1},
                             arms=[("running", "", flags)])
    status = "cancelled"
    summary: dict[str, Any] | None = None
    try:
        if not args.json:
            _print(f"bench {profile.name} on {host.name}: {spec.requests} requests at concurrency {spec.concurrency}, "
                   f"~{spec.input_len} input tokens, {spec.max_tokens} output tokens ({spec.warmup} warm-up)")
        await meter.start()
        result = await run_bench(base, profile.model, spec, on_result=_progress_printer(spec.requests, args.json))
        accept, source = await meter.stop(result.summary.accept_len)
        summary = result.summary.to_json() | {"accept_len": accept, "accept_source": source}
        store.add_trial(run_id, 0, 0, value=result.summary.output_tok_s, summary=summary, accept_len=accept,
                        accept_source=source, requests=result.results)
        status = "done"
    finally:
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        store.finish_run(run_id, status, summary=summary)
        store.close()
    if args.json:
        _print(json.dumps({"run_id": run_id, "profile": profile.name, "params": spec.to_json(), **summary}, indent=2))
    else:
        _print(text_table(bench_rows(summary)))
        for warning in result.summary.warnings:
            _print(f"warning: {warning}")
        _print(f"history: run #{run_id} (`tunedash export {run_id} --format md`)")
    return EXIT_OK if result.summary.completed else EXIT_START_FAILED


async def _follow(host: Any, path: str, backend: str, meter: AcceptanceMeter) -> None:
    parser = LogParser(backend)
    async with contextlib.aclosing(host.follow(path, from_start=False)) as lines:
        async for line in lines:
            for event in parser.feed(line):
                meter.feed(event)


# ---- ab ------------------------------------------------------------------------------------------
async def cmd_ab(args: argparse.Namespace) -> int:
    profile = _load(args)
    texts = [args.a, args.b, *(args.arm or [])]
    if len(texts) > len(ARM_LABELS):
        raise CliError(f"at most {len(ARM_LABELS)} arms")
    arms = [parse_arm(profile, text, ARM_LABELS[i]) for i, text in enumerate(texts)]
    trials = args.trials if args.trials is not None else profile.bench.trials
    if trials < 1:
        raise CliError(f"--trials must be at least 1 (got {trials}); 3 or more give a useful interval")
    spec = ExperimentSpec(arms, trials, _spec(profile, args), interleave=args.interleave,
                          ready_timeout_s=args.ready_timeout)
    host = host_for(profile)
    quiet = args.json or args.md
    lifecycle = _lifecycle(profile, host, argparse.Namespace(**{**vars(args), "json": quiet}))  # narrates unless quiet

    def on_progress(p: ExperimentProgress) -> None:
        if quiet or p.kind in ("request", "done"):
            return
        _print(f"[{p.trials_done}/{p.trials_total}] {p.text}")

    store = _store()
    experiment = Experiment(spec, lifecycle, store, on_progress=on_progress)
    if not quiet:
        order = " ".join(ARM_LABELS[a] for a, _ in spec.schedule())
        _print(f"A/B on {profile.name} ({host.name}): {len(arms)} arms x {trials} trials of {spec.bench.requests} "
               f"requests at concurrency {spec.bench.concurrency}; order {order}")
        for arm in arms:
            _print(f"  {arm.label}: {arm.overrides or '(the profile as is)'}")
    code = EXIT_OK
    try:
        await experiment.run()
    except ExperimentFailed as exc:
        print(f"tunedash: {exc}", file=sys.stderr)
        code = exc.exit_code
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
    data = experiment.result.to_json()
    if args.json:
        _print(json.dumps(data, indent=2))
        return
    if args.md and experiment.run_id is not None:
        run = store.run(experiment.run_id)
        if run is not None:
            _print(export_run(run, "md"))
            return
    _print(experiment_text(data))
    last = experiment.result.arms[experiment.spec.schedule()[-1][0]] if experiment.result.status == "done" else None
    if last is not None:
        _print(f"the server keeps running with arm {last.label} ({last.overrides or 'the profile as is'})")
    _print(f"history: run #{experiment.run_id} (`tunedash export {experiment.run_id} --format md`)")


# ---- history and export --------------------------------------------------------------------------
def cmd_history(args: argparse.Namespace) -> int:
    with _store() as store:
        runs = store.runs(args.limit)
        if args.json:
            _print(json.dumps([{
                "id": r.id, "kind": r.kind, "profile": r.profile, "host": r.host, "backend": r.backend,
                "model": r.model, "started_at": r.started_at, "finished_at": r.finished_at,
                "status": _status(r.status, r.finished_at), "trials": r.trial_count, "verdict": r.verdict,
                "summary": r.summary} for r in runs], indent=2))
            return EXIT_OK
        if not runs:
            _print(f"no runs yet in {store.path}; `tunedash bench PROFILE` or `tunedash ab PROFILE ...` adds some")
            return EXIT_OK
        rows = [["id", "when", "kind", "profile", "status", "trials", "result"]]
        for r in runs:
            result = r.verdict or _bench_line(r.summary) or ""
            rows.append([str(r.id), time.strftime("%m-%d %H:%M", time.localtime(r.started_at)), r.kind, r.profile,
                         _status(r.status, r.finished_at), str(r.trial_count), result[:90]])
        _print(text_table(rows))
    return EXIT_OK


def _status(status: str, finished: float | None) -> str:
    return "interrupted" if status == "running" and finished is None else status


def _bench_line(summary: dict[str, Any] | None) -> str:
    if not summary or summary.get("output_tok_s") is None:
        return ""
    accept = summary.get("accept_len")
    return f"{summary['output_tok_s']:.1f} tok/s" + (f", accept {accept:.2f}" if accept is not None else "")


def cmd_export(args: argparse.Namespace) -> int:
    with _store() as store:
        run = store.run(args.id)
        if run is None:
            raise CliError(f"no run #{args.id} in {store.path}; `tunedash history` lists the runs", EXIT_BAD_INPUT)
        text = export_run(run, args.format)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise CliError(f"{args.output}: cannot write the export ({exc.strerror or exc})") from None
        _print(f"run #{args.id} written to {args.output}")
    else:
        sys.stdout.write(text)
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
    """Add bench, ab, history and export to the `tunedash` subparsers."""
    p = sub.add_parser("bench", help="benchmark the running server: N requests at concurrency C")
    p.add_argument("profile")
    with_overrides(p)
    _bench_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("ab", help="A/B: relaunch each arm, run trials, report B/A with a 95%% interval")
    p.add_argument("profile")
    with_overrides(p)
    p.add_argument("--a", required=True, metavar='"F=V ..."', help="arm A's flag overrides ('' = the profile)")
    p.add_argument("--b", required=True, metavar='"F=V ..."', help="arm B's flag overrides (!F unsets F)")
    p.add_argument("--arm", action="append", metavar='"F=V ..."', help="more arms (C, D, ...), each against A")
    p.add_argument("--trials", type=int, help="trials per arm (default: the profile's [bench] trials)")
    p.add_argument("--interleave", action="store_true", help="order A B B A ... (a relaunch per change)")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for each arm's server")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for free GPUs between arms")
    p.add_argument("--grace", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL")
    _bench_options(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--md", action="store_true", help="Markdown ready for a pull request")
    p.set_defaults(func=cmd_ab)

    p = sub.add_parser("history", help="past benchmark and A/B runs")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("export", help="one run as Markdown (for a PR), CSV (per trial) or JSON")
    p.add_argument("id", type=int)
    p.add_argument("--format", choices=["md", "csv", "json"], default="md")
    p.add_argument("-o", "--output", help="write to a file instead of stdout")
    p.set_defaults(func=cmd_export)
