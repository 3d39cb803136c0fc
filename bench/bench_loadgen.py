"""Load-generator ceiling: output tokens/s our generator consumes from a server streaming as fast as it can.

The server is the simulated SGLang server with every per-step cost set to zero (TUNEDASH_SIM_SPEED_FILE),
so each decode step is one event-loop turn; it runs in its own process (TP 2, NEXTN 3 steps: several
tokens per chunk). Clients, in the same run,
alternating, the same request set each time:
  ours       app.core.measure.bench.run_bench (one ClientSession and connection pool per run, N workers)
  per-req    a minimal aiohttp client in the style of sglang's bench_serving (one ClientSession per request)
  vllm       `vllm bench serve` from the vLLM CPU environment (scripts/vllm-cpu-env), when present:
             --backend openai (/v1/completions), random dataset of our lengths, our requests and
             concurrency, --ignore-eos, the tiny model's tokenizer; its own output tok/s and token total
For each: output tok/s (usage tokens / wall), client CPU seconds per 1000 tokens (what the client costs
on its core; for vllm, its process's CPU from "Starting main benchmark run..." to the result banner, read
from /proc, with its whole-process CPU, start-up included, printed beside), and whether its token count
equals the server's own counter (sglang:generation_tokens_total delta). vllm's count comes from the usage
chunk the server streams (it re-tokenizes text only when usage is missing); what re-tokenizing would have
counted is printed too. Medians of --reps runs, ratios against ours, and the load average.

Run: .venv/bin/python bench/bench_loadgen.py [--reps 5] [--requests 64] [--concurrency 16] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from app.core.measure.bench import BenchSpec, build_prompts, run_bench
from app.sim.host_env import reset_state, sim_environment

ZERO_SPEED = """target_ms_per_weight_gib = 0.0
overhead_ms = 0.0
draft_step_ms = 0.0
verify_per_draft_token_ms = 0.0
noise_sigma = 0.0
prefill_base_ms = 0.001  # not 0: the prefill log line divides by it
prefill_ms_per_token = 0.0
[draft_step_ms_by_algorithm]
NGRAM = 0.0
"""
MODEL = "sim/qwen3.6-27b"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_tokens(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("sglang:generation_tokens_total{"))


async def per_request_client(base: str, spec: BenchSpec, prompts: list[str]) -> int:
    """sglang bench_serving style: a new ClientSession per request, a semaphore for concurrency."""
    sem = asyncio.Semaphore(spec.concurrency)

    async def one(prompt: str) -> int:
        async with sem, aiohttp.ClientSession() as session:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": spec.max_tokens, "stream": True,
                    "ignore_eos": True, "stream_options": {"include_usage": True}}
            tokens = 0
            async with session.post(f"{base}/v1/completions", json=body) as response:
                async for raw in response.content:
                    line = raw.strip()
                    if not line.startswith(b"data:") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
            return tokens

    return sum(await asyncio.gather(*(one(p) for p in prompts)))


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a live process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class PeerRun:
    rate: float  # its "Output token throughput (tok/s):" line
    tokens: int  # its "Total generated tokens:" line
    cpu_window: float  # its CPU seconds from "Starting main benchmark run..." to the result banner
    cpu_process: float  # its whole process's CPU seconds (start-up, the dataset, the run, the report)
    retokenized: int  # what re-tokenizing its generated texts with --tokenizer would have counted instead


def run_vllm(python: str, tokenizer: str, port: int, spec: BenchSpec, out_dir: Path) -> PeerRun:
    """One `vllm bench serve` run against the server (OpenAI completions, the same request shape as ours).

    Its token counts: the sim streams a final usage chunk (choices []) when asked for include_usage, and
    vLLM's completions client takes completion_tokens from it; it re-tokenizes the generated text with
    --tokenizer only for a request whose usage is missing. `retokenized` shows what that would give.
    """
    vllm = str(Path(python).with_name("vllm"))
    argv = [vllm, "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
            "--endpoint", "/v1/completions", "--model", MODEL, "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(spec.input_len), "--random-output-len", str(spec.max_tokens),
            "--num-prompts", str(spec.requests), "--max-concurrency", str(spec.concurrency), "--ignore-eos",
            "--save-result", "--save-detailed", "--result-dir", str(out_dir), "--result-filename", "r.json",
            "--disable-tqdm"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_TARGET_DEVICE": "cpu"}
    before = cpu_children()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    window: list[float] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # live, so the window's CPU is read while the process runs
        lines.append(line)
        if line.startswith("Starting main benchmark run") or "Serving Benchmark Result" in line:
            window.append(proc_cpu(proc.pid))
    proc.wait(timeout=60)
    cpu_process = cpu_children() - before
    text = "".join(lines)
    if proc.returncode != 0 or len(window) != 2:
        raise RuntimeError(text[-2000:])
    found = {}
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("Output token throughput (tok/s)", "Total generated tokens", "Failed requests"):
            found[key.strip()] = float(value)
    if found.get("Failed requests"):
        raise RuntimeError(f"vllm bench serve: {found['Failed requests']:.0f} failed requests")
    texts = json.loads((out_dir / "r.json").read_text())["generated_texts"]
    count = subprocess.run(
        [python, "-c", "import json, sys; from tokenizers import Tokenizer; t = Tokenizer.from_file(sys.argv[1]); "
         "print(sum(len(t.encode(x, add_special_tokens=False).ids) for x in json.load(sys.stdin)))",
         str(Path(tokenizer) / "tokenizer.json")],
        input=json.dumps(texts), capture_output=True, text=True, timeout=120, check=True)
    return PeerRun(found["Output token throughput (tok/s)"], int(found["Total generated tokens"]),
                   window[1] - window[0], cpu_process, int(count.stdout))


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()
    spec = BenchSpec(requests=args.requests, concurrency=args.concurrency, input_len=32,
                     max_tokens=args.max_tokens, warmup=0)
    tmp = Path(tempfile.mkdtemp(prefix="tunedash-bench-loadgen-"))
    state = reset_state(tmp / "sim")
    speed = tmp / "zero.toml"
    speed.write_text(ZERO_SPEED)
    port = free_port()
    env = {**os.environ, **sim_environment(state), "TUNEDASH_SIM_SPEED_FILE": str(speed),
           "TUNEDASH_SIM_STARTUP_S": "0.2"}
    server = subprocess.Popen(  # noqa: ASYNC220 - the server under test, started once
        [sys.executable, "-m", "app.sim.sglang", "--model-path", MODEL,
         "--port", str(port), "--tp-size", "2", "--enable-metrics", "--max-running-requests", "256",
         "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        executable=None)
    base = f"http://127.0.0.1:{port}"
    vllm_env = "--no-vllm" if args.no_vllm else _vllm_python()
    results: dict[str, list[tuple[float, float, bool]]] = {"ours": [], "per-req": [], "vllm": []}
    peer: list[PeerRun] = []
    vllm_failed = vllm_env if isinstance(vllm_env, str) else ""
    load_before = os.getloadavg()
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as response:  # noqa: ASYNC210
                    if response.status == 200:
                        break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError("the simulated server exited; run it by hand to see why") from None
                await asyncio.sleep(0.1)
        prompts = build_prompts(spec, spec.requests)
        for _rep in range(args.reps):
            before, cpu0, t0 = server_tokens(port), cpu_self(), time.monotonic()
            res = await run_bench(base, MODEL, spec)
            if res.summary.errors:
                raise RuntimeError(f"our client saw errors: {res.summary.error_kinds}")
            wall, cpu = time.monotonic() - t0, cpu_self() - cpu0
            ok = server_tokens(port) - before == res.summary.output_tokens
            results["ours"].append((res.summary.output_tokens / wall, cpu / res.summary.output_tokens * 1000, ok))

            before, cpu0, t0 = server_tokens(port), cpu_self(), time.monotonic()
            tokens = await per_request_client(base, spec, prompts)
            wall, cpu = time.monotonic() - t0, cpu_self() - cpu0
            ok = server_tokens(port) - before == tokens
            results["per-req"].append((tokens / wall, cpu / max(tokens, 1) * 1000, ok))

            if isinstance(vllm_env, tuple) and not vllm_failed:
                before = server_tokens(port)  # no ready check, no warm-ups: the process sends only the run
                try:
                    run = run_vllm(vllm_env[0], vllm_env[1], port, spec, tmp)
                except (RuntimeError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
                    vllm_failed = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                    continue
                ok = server_tokens(port) - before == run.tokens
                peer.append(run)
                results["vllm"].append((run.rate, run.cpu_window / max(run.tokens, 1) * 1000, ok))
    finally:
        os.killpg(server.pid, 9)
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    print(f"{args.requests} requests x {args.max_tokens} tokens at concurrency {args.concurrency}, "
          f"{args.reps} reps (medians); server: simulated SGLang with zero step cost")
    print(f"machine: {os.cpu_count()} CPUs, load average (1/5/15 min) "
          f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in load_after)} after")
    ours_rate = statistics.median(r[0] for r in results["ours"])
    ours_cpu = statistics.median(r[1] for r in results["ours"])
    for name, rows in results.items():
        if not rows:
            print(f"{name:8} not run ({vllm_failed or 'no vLLM CPU environment'})")
            continue
        rate = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        exact = all(r[2] for r in rows)
        print(f"{name:8} {rate:9.0f} tok/s  (ours/this {ours_rate / rate:5.2f}x)   client CPU {cpu * 1000:7.1f} ms "
              f"per 1000 tokens (this/ours {cpu / ours_cpu:5.2f}x)   tokens == server's counter: {exact}")
        paired = statistics.median(o[0] / r[0] for o, r in zip(results["ours"], rows, strict=False))
        print(f"{'':8} per rep: {', '.join(f'{r[0]:.0f}' for r in rows)} tok/s; "
              f"{', '.join(f'{r[1] * 1000:.1f}' for r in rows)} ms CPU per 1000 tokens; "
              f"ours/this within a rep, median {paired:.2f}x")
    if peer:
        whole = statistics.median(r.cpu_process / max(r.tokens, 1) * 1000 for r in peer)
        whole_s = statistics.median(r.cpu_process for r in peer)
        print(f"vllm: its CPU above is the main run's window; its whole process (start-up, imports, dataset, "
              f"report) took {whole_s:.1f} s a run, {whole * 1000:.0f} ms per 1000 tokens")
        source = ("the server's usage (equal to its counter)" if all(r[2] for r in results["vllm"])
                  else "not the server's counter")
        print(f"vllm: its token counts {', '.join(str(r.tokens) for r in peer)}: {source}; re-tokenizing its "
              f"texts with --tokenizer would give {', '.join(str(r.retokenized) for r in peer)}")

def _vllm_python() -> tuple[str, str] | str:
    """(the vLLM CPU venv's python, the tiny model folder), or why there is none."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "vllm-cpu-env"
    if not script.exists():
        return "no scripts/vllm-cpu-env"
    proc = subprocess.run([str(script), "--check"], capture_output=True, text=True, timeout=60)
    found = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    if proc.returncode != 0 or "python" not in found or "model" not in found:
        return proc.stderr.strip().replace("\n", "; ") or "no vLLM CPU environment"
    return found["python"], found["model"]


if __name__ == "__main__":
    asyncio.run(main())
