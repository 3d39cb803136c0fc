"""Load-generator ceiling: output tokens/s our generator consumes from a server streaming as fast as it can.

Two servers, each in its own process, each started once:
  sim      the simulated SGLang server with every per-step cost set to zero (TUNEDASH_SIM_SPEED_FILE), TP 2,
           NEXTN 3 steps (about 3.2 tokens per chunk); each decode step is one event-loop turn, and its own
           Python per chunk (json.dumps, aiohttp's writer, a queue) costs about as much as a client's reading
  replay   this file's own server (--replay-server): the sim's chunks, pre-rendered, one HTTP chunk per SSE
           event, one event per stream per step (as a decode step sends them), so that a client, not the
           server, is what limits: the ceiling proper
Clients, in the same run, alternating, the same request set each time:
  ours       app.core.measure.bench.run_bench (kept connections of stream_http, bytes parsed as they arrive)
  aiohttp    the load generator before it (one aiohttp ClientSession, readline per SSE line, stdlib json)
  per-req    a minimal aiohttp client in the style of sglang's bench_serving (one ClientSession per request)
  vllm       `vllm bench serve` from the vLLM CPU environment (scripts/vllm-cpu-env), when present:
             --backend openai (/v1/completions), random dataset of our lengths, our requests and
             concurrency, --ignore-eos, the tiny model's tokenizer; its own output tok/s and token total
For each: output tok/s (usage tokens / wall), client CPU seconds per 1000 tokens (what the client costs
on its core; for vllm, its process's CPU from "Starting main benchmark run..." to the result banner, read
from /proc), the server's share of a core over the run, and whether the token count equals the server's
own counter (sglang:generation_tokens_total delta). Medians of --reps runs, ratios of ours against each
(also the median of the ratios within a rep), and the load average of this shared machine.

Run: .venv/bin/python bench/bench_loadgen.py [--reps 5] [--concurrency 16 32 64] [--requests N] [--max-tokens 256]
     [--servers sim replay] [--no-vllm]
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

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


async def kept_session_client(base: str, spec: BenchSpec, prompts: list[str]) -> int:
    """The load generator before stream_http: one aiohttp ClientSession and pool, readline per SSE line, each
    line decoded and parsed with the standard library's json, TTFT/ITL stamped per chunk."""
    connector = aiohttp.TCPConnector(limit=spec.concurrency)
    total = 0
    queue = list(reversed(prompts))
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal total
            while queue:
                body = {"model": MODEL, "prompt": queue.pop(), "max_tokens": spec.max_tokens, "stream": True,
                        "stream_options": {"include_usage": True}, "temperature": 0.0, "ignore_eos": True}
                last, itl, tokens = None, [], 0
                async with session.post(f"{base}/v1/completions", json=body) as response:
                    while raw := await response.content.readline():
                        line = raw.decode().strip()
                        if not line.startswith("data:") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[5:])
                        if (chunk.get("usage") or {}).get("completion_tokens") is not None:
                            tokens = chunk["usage"]["completion_tokens"]
                        if any(c.get("text") for c in chunk.get("choices") or []):
                            now = time.monotonic()
                            if last is not None:
                                itl.append(now - last)
                            last = now
                total += tokens

        await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
    return total


# ---- the replay server: the sim's chunks at almost no cost per chunk ------------------------------------------
ACCEPTS = (4, 3, 3, 2, 4)  # tokens per chunk, cycled: 3.2 on average, as the sim's NEXTN 3 steps
WORD = " tok"  # one token of text


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict | str) -> bytes:
    return _http_chunk(b"data: " + (obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()) + b"\n\n")


class ReplayStream:
    """One answer in flight: its events, pre-rendered, and how many were written."""

    def __init__(self, transport: asyncio.Transport, max_tokens: int, usage: bool) -> None:
        self.transport = transport
        self.events: list[bytes] = []
        done = 0
        i = 0
        rid = os.urandom(16).hex()
        while done < max_tokens:
            n = min(ACCEPTS[i % len(ACCEPTS)], max_tokens - done)
            self.events.append(_event({"id": rid, "object": "text_completion", "created": 1764582000,
                                       "model": MODEL, "choices": [{"index": 0, "text": WORD * n,
                                                                    "logprobs": None, "finish_reason": None}],
                                       "usage": None}))
            done += n
            i += 1
        self.tokens = done
        tail = _event({"id": rid, "object": "text_completion", "created": 1764582000, "model": MODEL,
                       "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
                       "usage": None})
        if usage:
            tail += _event({"id": rid, "object": "text_completion", "created": 1764582000, "model": MODEL,
                            "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": done,
                                                     "total_tokens": done + 8}})
        self.events.append(tail + _event("[DONE]") + b"0\r\n\r\n")
        self.sent = 0


class ReplayServer(asyncio.Protocol):
    """A keep-alive HTTP/1.1 server: POST /v1/completions streams a ReplayStream, one event per stream per step
    (a step: one event-loop turn, as the sim's zero-cost decode step); GET /metrics and /health answer at once."""

    streams: ClassVar[list[ReplayStream]] = []
    wake: ClassVar[asyncio.Event]
    tokens_total: ClassVar[int] = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4:end + 4 + length], self.buffer[end + 4 + length:]
            self.answer(head.split(" ")[1], body)

    def answer(self, path: str, body: bytes) -> None:
        if path.startswith("/v1/completions"):
            request = json.loads(body)
            usage = bool((request.get("stream_options") or {}).get("include_usage"))
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
            stream = ReplayStream(self.transport, int(request.get("max_tokens") or 16), usage)
            ReplayServer.tokens_total += stream.tokens
            ReplayServer.streams.append(stream)
            ReplayServer.wake.set()
            return
        text = (f'sglang:generation_tokens_total{{model_name="{MODEL}"}} {ReplayServer.tokens_total}\n'
                if path.startswith("/metrics") else "ok")
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text.encode()))


async def replay_server(port: int) -> None:
    """Serve until killed; each step writes the next event of every stream whose socket takes it."""
    loop = asyncio.get_running_loop()
    ReplayServer.wake = asyncio.Event()
    server = await loop.create_server(ReplayServer, "127.0.0.1", port)
    async with server:
        streams = ReplayServer.streams
        while True:
            if not streams:
                ReplayServer.wake.clear()
                await ReplayServer.wake.wait()
            for stream in list(streams):
                if stream.transport.is_closing():
                    streams.remove(stream)
                elif stream.transport.get_write_buffer_size() < 65536:  # the client keeps up: the next event
                    stream.transport.write(stream.events[stream.sent])
                    stream.sent += 1
                    if stream.sent == len(stream.events):
                        streams.remove(stream)
            await asyncio.sleep(0)


def start_server(kind: str, tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    if kind == "replay":
        argv = [sys.executable, __file__, "--replay-server", str(port)]
        env = dict(os.environ)
    else:
        state = reset_state(tmp / "sim")
        speed = tmp / "zero.toml"
        speed.write_text(ZERO_SPEED)
        env = {**os.environ, **sim_environment(state), "TUNEDASH_SIM_SPEED_FILE": str(speed),
               "TUNEDASH_SIM_STARTUP_S": "0.2"}
        argv = [sys.executable, "-m", "app.sim.sglang", "--model-path", MODEL,
                "--port", str(port), "--tp-size", "2", "--enable-metrics", "--max-running-requests", "256",
                "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", "4"]
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, cwd=Path(__file__).resolve().parents[1])
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return server, port
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.1)
    os.killpg(server.pid, 9)
    raise RuntimeError(f"the {kind} server did not come up; run it by hand to see why")


@dataclass
class Row:
    rate: float  # output tok/s
    cpu_ms: float  # client CPU ms per 1000 tokens
    exact: bool  # tokens == the server's counter
    server_share: float  # the server's CPU seconds / the run's wall seconds


async def measure(port: int, server_pid: int, spec: BenchSpec, reps: int, vllm_env: tuple[str, str] | str,
                  tmp: Path) -> tuple[dict[str, list[Row]], list[PeerRun], str]:
    base = f"http://127.0.0.1:{port}"
    prompts = build_prompts(spec, spec.requests)
    rows: dict[str, list[Row]] = {"ours": [], "aiohttp": [], "per-req": [], "vllm": []}
    peer: list[PeerRun] = []
    vllm_failed = vllm_env if isinstance(vllm_env, str) else ""

    def row(tokens: float, wall: float, cpu: float, before: float, server_cpu: float) -> Row:
        return Row(tokens / wall, cpu / max(tokens, 1) * 1e6, server_tokens(port) - before == tokens,
                   server_cpu / wall)

    await run_bench(base, MODEL, replace(spec, requests=spec.concurrency))  # warm the server's code paths
    for _rep in range(reps):
        before, cpu0, s0, t0 = server_tokens(port), cpu_self(), proc_cpu(server_pid), time.monotonic()
        res = await run_bench(base, MODEL, spec)
        wall, cpu, s1 = time.monotonic() - t0, cpu_self() - cpu0, proc_cpu(server_pid)
        if res.summary.errors:
            raise RuntimeError(f"our client saw errors: {res.summary.error_kinds}")
        rows["ours"].append(row(res.summary.output_tokens, wall, cpu, before, s1 - s0))

        for name, peer_client in (("aiohttp", kept_session_client), ("per-req", per_request_client)):
            before, cpu0, s0, t0 = server_tokens(port), cpu_self(), proc_cpu(server_pid), time.monotonic()
            tokens = await peer_client(base, spec, prompts)
            wall, cpu, s1 = time.monotonic() - t0, cpu_self() - cpu0, proc_cpu(server_pid)
            rows[name].append(row(tokens, wall, cpu, before, s1 - s0))

        if isinstance(vllm_env, tuple) and not vllm_failed:
            before, s0 = server_tokens(port), proc_cpu(server_pid)  # no ready check, no warm-ups
            try:
                run = run_vllm(vllm_env[0], vllm_env[1], port, spec, tmp)
            except (RuntimeError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
                vllm_failed = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                continue
            peer.append(run)
            share = (proc_cpu(server_pid) - s0) / max(run.tokens / run.rate, 1e-9)  # its whole run: an upper bound
            rows["vllm"].append(Row(run.rate, run.cpu_window / max(run.tokens, 1) * 1e6,
                                    server_tokens(port) - before == run.tokens, share))
    return rows, peer, vllm_failed


def report(kind: str, spec: BenchSpec, rows: dict[str, list[Row]], peer: list[PeerRun], why_not: str) -> None:
    print(f"\n[{kind}] {spec.requests} requests x {spec.max_tokens} tokens at concurrency {spec.concurrency}")
    ours = rows["ours"]
    ours_rate = statistics.median(r.rate for r in ours)
    ours_cpu = statistics.median(r.cpu_ms for r in ours)
    for name, got in rows.items():
        if not got:
            print(f"  {name:8} not run ({why_not or 'no vLLM CPU environment'})")
            continue
        rate = statistics.median(r.rate for r in got)
        cpu = statistics.median(r.cpu_ms for r in got)
        paired = statistics.median(o.rate / r.rate for o, r in zip(ours, got, strict=False))
        share = statistics.median(r.server_share for r in got)
        print(f"  {name:8} {rate:8.0f} tok/s (ours/this {ours_rate / rate:4.2f}x, within a rep {paired:4.2f}x)  "
              f"client CPU {cpu:5.2f} ms/1000 tokens (this/ours {cpu / ours_cpu:4.2f}x)  "
              f"server {share * 100:3.0f}% of a core  tokens == server's: {all(r.exact for r in got)}")
        print(f"  {'':8} per rep: {', '.join(f'{r.rate:.0f}' for r in got)} tok/s; "
              f"{', '.join(f'{r.cpu_ms:.2f}' for r in got)} ms CPU/1000 tokens")
    if peer:
        print(f"  vllm: token counts {', '.join(str(r.tokens) for r in peer)} (the server's usage); its whole "
              f"process took {statistics.median(r.cpu_process for r in peer):.1f} s CPU a run (start-up included)")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--requests", type=int, default=None, help="per run (default: 16 x the concurrency)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--servers", nargs="+", choices=["sim", "replay"], default=["sim", "replay"])
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--replay-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replay_server:
        await replay_server(args.replay_server)
        return
    vllm_env = "--no-vllm" if args.no_vllm else _vllm_python()
    load_before = os.getloadavg()
    for kind in args.servers:
        tmp = Path(tempfile.mkdtemp(prefix="tunedash-bench-loadgen-"))
        server, port = start_server(kind, tmp)
        try:
            for concurrency in args.concurrency:
                spec = BenchSpec(requests=args.requests or 16 * concurrency, concurrency=concurrency, input_len=32,
                                 max_tokens=args.max_tokens, warmup=0)
                rows, peer, why_not = await measure(port, server.pid, spec, args.reps, vllm_env, tmp)
                report(kind, spec, rows, peer, why_not)
        finally:
            os.killpg(server.pid, 9)
            server.wait()
            shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    print(f"\nmachine: {os.cpu_count()} CPUs shared with others, load average (1/5/15 min) "
          f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in load_after)} after; "
          f"{args.reps} reps, medians")


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
