"""The simulated SGLang server: startup logs, readiness, streaming, shutdown, orphans and fault knobs."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from app.sim import gpu_state
from tests.helpers import GroupReaper, free_port, smi, wait_until

READY = "The server is fired up and ready to roll!"
# Regexes for the lines of docs/servers.md#sglang-log-lines (what app/core/logs/parser.py parses).
PREFIX = re.compile(
    r"\[(?P<ts>(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?:\.\d{3})?)(?P<ranks>(?: (?:DP|TP|PP|EP)\d+)*)\]\s"
)
LOAD_END = re.compile(
    r"Load weight end\. (?:elapsed=(?P<elapsed>[\d.]+) s, )?type=(?P<arch>\w+), (?:dtype=(?P<dtype>[\w.]+), )?"
    r".*?avail mem=(?P<avail>[\d.]+) GB(?:, mem usage=(?P<used>[\d.]+) GB)?"
)
KV_ALLOC = re.compile(
    r"KV Cache is allocated\. #tokens: (?P<tokens>\d+), (?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|"
    r"KV size: (?P<kv>[\d.]+) GB)"
)
CG_BEGIN = re.compile(r"Capture (?P<kind>cuda|cpu|npu|musa|piecewise CUDA|draft cuda|draft extend cuda) graph begin\.")
CG_END = re.compile(
    r"Capture (?P<kind>.+?) graph end\. Time elapsed: (?P<secs>[\d.]+) s(?:\. mem usage=(?P<used>[\d.]+) GB\. "
    r"avail mem=(?P<avail>[\d.]+) GB\.)?"
)
DECODE = re.compile(
    r"Decode batch(?: \[\d+\])?[.,] #running-req: (?P<running>\d+), .*?"
    r"(?:accept len: (?P<accept_len>[\d.]+), (?:accept rate: (?P<accept_rate>[\d.]+), )?)?"
    r"(?:.*?(?P<graph_kind>cuda|cpu|npu|musa) graph: (?P<graph>True|False), )?"
    r"gen throughput \(token/s\): (?P<gen_tps>[\d.]+), (?:largest-len: \d+, )?#queue-req: (?P<queue>\d+)"
)
UVICORN = re.compile(r"Uvicorn running on (?P<url>\S+) \(Press CTRL\+C to quit\)")


class Server:
    """A simulated server started in its own process group, logging to a file."""

    def __init__(self, reaper: GroupReaper, env: dict[str, str], log: Path, *flags: str, model: str = "sim/qwen3.6-27b",
                 tp: int = 2) -> None:
        self.port = free_port()
        self.log = log
        argv = [sys.executable, "-m", "app.sim.sglang", "--model-path", model, "--tp-size", str(tp),
                "--port", str(self.port), *flags]
        with log.open("w") as fh:
            self.proc = reaper.start(argv, env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd="/")

    def text(self) -> str:
        return self.log.read_text()

    def wait_ready(self, timeout: float = 15) -> None:
        wait_until(lambda: READY in self.text() or self.proc.poll() is not None, timeout, "READY or an exit",
                   self.text)
        assert READY in self.text(), self.text()

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""

    def post(self, path: str, body: dict[str, object]) -> bytes:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            data: bytes = r.read()
            return data


def mem_used(env: dict[str, str]) -> list[int]:
    out = smi(env, "--query-gpu=memory.used", "--format=csv,noheader,nounits")
    return [int(x) for x in out.stdout.split()]


def children(pgid: int) -> list[tuple[int, str]]:
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,comm="], capture_output=True, text=True, check=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()]
    return [(int(p), c.strip()) for p, g, c in rows if int(g) == pgid]


def test_startup_logs_ready_stream_and_group_kill(sim_env: dict[str, str], tmp_path: Path, reaper: GroupReaper) -> None:
    srv = Server(reaper, sim_env, tmp_path / "server.log", "--speculative-algorithm", "EAGLE",
                 "--speculative-num-steps", "3", "--enable-metrics", "--decode-log-interval", "5")
    srv.wait_ready()
    text = srv.text()
    lines = text.splitlines()
    assert all(PREFIX.search(line) for line in lines), text
    assert any(" TP0] " in line for line in lines) and any(" TP1] " in line for line in lines)
    assert LOAD_END.search(text).group("arch") == "Qwen3_5ForConditionalGeneration"  # type: ignore[union-attr]
    assert KV_ALLOC.search(text)
    assert "Mamba Cache is allocated." in text
    kinds = {m.group("kind") for m in CG_BEGIN.finditer(text)}
    assert kinds == {"cuda", "draft cuda", "draft extend cuda"}  # piecewise silently off (spec + multimodal)
    assert len(CG_END.findall(text)) == 6
    assert "Capture piecewise CUDA graph" not in text
    assert "Disable piecewise CUDA graph" not in text  # silent, like SGLang 0.5.10-0.5.12
    assert UVICORN.search(text)
    assert text.index("Uvicorn running") < text.index(READY)
    assert "Overlap scheduler is disabled when spec v2 is off" in text

    # Ranks are named like SGLang's, in the launcher's process group, and hold memory per GPU.
    comms = [c for _, c in children(srv.proc.pid)]
    assert comms.count("sglang::schedul") == 2 and "sglang::detoken" in comms
    apps = smi(sim_env, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits")
    names = sorted(line.split(", ")[1] for line in apps.stdout.splitlines())
    assert names == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    used = mem_used(sim_env)
    assert all(u > 0.8 * 49140 for u in used)

    status, _ = srv.get("/health")
    assert status == 200
    info = json.loads(srv.get("/get_server_info")[1])
    assert info["tp_size"] == 2 and info["disable_piecewise_cuda_graph"] is True
    assert info["speculative_num_draft_tokens"] == 4 and info["disable_overlap_schedule"] is True
    assert "last_gen_throughput" in info["internal_states"][0]

    raw = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 40, "stream": True,
                                       "stream_options": {"include_usage": True}}).decode()
    events = [e[len("data: "):] for e in raw.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 40
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert len(texts) < 40  # speculative decoding sends several tokens per chunk
    wait_until(lambda: DECODE.search(srv.text()) is not None, 5, "a decode line")
    decode = DECODE.search(srv.text())
    assert decode is not None and "accept len: " in decode.group(0)
    info = json.loads(srv.get("/get_server_info")[1])
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1.5
    status, metrics = srv.get("/metrics")
    assert status == 200 and b"sglang:gen_throughput{" in metrics

    os.killpg(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait()
    wait_until(lambda: mem_used(sim_env) == [0, 0], 5, "both GPUs free")
    assert smi(sim_env, "--query-compute-apps=pid", "--format=csv,noheader").stdout == ""


def test_chat_stream_and_no_metrics_without_flag(sim_env: dict[str, str], tmp_path: Path, reaper: GroupReaper) -> None:
    srv = Server(reaper, sim_env, tmp_path / "server.log", model="sim/llama-3.1-8b", tp=1)
    srv.wait_ready()
    text = srv.text()
    assert "Capture piecewise CUDA graph begin." in text  # on by default for a text-only model
    assert " TP0]" not in text  # TP=1 schedulers log without a rank
    raw = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                                            "stream": True}).decode()
    chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).strip()
    assert srv.get("/metrics")[0] == 404
    models = json.loads(srv.get("/v1/models")[1])
    assert models["data"][0]["id"] == "sim/llama-3.1-8b"


def test_sigterm_drains_then_exits_with_children(sim_env: dict[str, str], tmp_path: Path, reaper: GroupReaper) -> None:
    srv = Server(reaper, sim_env, tmp_path / "server.log")
    srv.wait_ready()
    pids = [p for p, _ in children(srv.proc.pid)]
    os.killpg(srv.proc.pid, signal.SIGTERM)
    assert srv.proc.wait(timeout=10) == 0
    assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in srv.text()
    wait_until(lambda: not [p for p in pids if Path(f"/proc/{p}").exists() and gpu_state.process_start_time(p)],
               10, "the ranks to exit")
    wait_until(lambda: mem_used(sim_env) == [0, 0], 5, "both GPUs free")


def test_sigkill_of_main_alone_orphans_ranks(sim_env: dict[str, str], tmp_path: Path, reaper: GroupReaper) -> None:
    srv = Server(reaper, sim_env, tmp_path / "server.log")
    srv.wait_ready()
    held = mem_used(sim_env)
    srv.proc.kill()
    srv.proc.wait()
    time.sleep(0.8)  # well past the release delay
    assert mem_used(sim_env) == held
    assert len(children(srv.proc.pid)) == 3  # 2 schedulers + detokenizer, reparented, same group
    os.killpg(srv.proc.pid, signal.SIGKILL)
    wait_until(lambda: mem_used(sim_env) == [0, 0], 5, "both GPUs free")
    released = gpu_state.released_log(Path(sim_env["TUNEDASH_SIM_STATE"]))
    assert released and all(r["released_at"] >= r["dead_since"] + 0.3 - 1e-6 for r in released)


def test_fault_crash_loading(sim_env: dict[str, str], tmp_path: Path, reaper: GroupReaper) -> None:
    env = {**sim_env, "TUNEDASH_SIM_FAULT": "crash_loading"}
    srv = Server(reaper, env, tmp_path / "server.log")
    assert srv.proc.wait(timeout=15) != 0
    text = srv.text()
    assert "Scheduler hit an exception: Traceback (most recent call last):" in text
    assert "Received sigquit from a child process. It usually means the child failed." in text
    assert READY not in text
    wait_until(lambda: mem_used(sim_env) == [0, 0], 5, "both GPUs free")


def test_fault_oom_capture(sim_env: dict[str, str], tmp_path: Path, reaper: GroupReaper) -> None:
    env = {**sim_env, "TUNEDASH_SIM_FAULT": "oom_capture"}
    srv = Server(reaper, env, tmp_path / "server.log")
    assert srv.proc.wait(timeout=15) != 0
    text = srv.text()
    assert "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate" in text
    assert "torch.OutOfMemoryError: CUDA out of memory." in text
    assert "Capture cuda graph end" not in text


def test_fault_never_release(sim_env: dict[str, str], tmp_path: Path, reaper: GroupReaper) -> None:
    env = {**sim_env, "TUNEDASH_SIM_FAULT": "never_release"}
    srv = Server(reaper, env, tmp_path / "server.log")
    srv.wait_ready()
    os.killpg(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait()
    time.sleep(0.8)
    apps = smi(sim_env, "--query-compute-apps=pid,process_name", "--format=csv,noheader").stdout.splitlines()
    assert sorted(line.split(", ")[1] for line in apps) == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    assert all(u > 0 for u in mem_used(sim_env))


def test_port_in_use(sim_env: dict[str, str], tmp_path: Path, reaper: GroupReaper) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "app.sim.sglang", "--model-path", "sim/qwen3.6-27b", "--tp-size", "2",
                "--port", str(port)]
        log = tmp_path / "busy.log"
        with log.open("w") as fh:
            proc = reaper.start(argv, sim_env, stdout=fh, stderr=subprocess.STDOUT)
        assert proc.wait(timeout=15) == 1
    text = log.read_text()
    assert f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): " \
           "address already in use" in text
    wait_until(lambda: mem_used(sim_env) == [0, 0], 5, "both GPUs free")


def test_unknown_flag_and_unknown_model(sim_env: dict[str, str]) -> None:
    base = [sys.executable, "-m", "app.sim.sglang"]
    bad = subprocess.run([*base, "--model-path", "sim/qwen3.6-27b", "--bogus-flag"], env=sim_env,
                         capture_output=True, text=True, timeout=20, check=False)
    assert bad.returncode == 2
    assert "sglang serve: error: unrecognized arguments: --bogus-flag" in bad.stderr  # 0.5.10's own prog name
    unknown = subprocess.run([*base, "--model-path", "nobody/nothing"], env=sim_env, capture_output=True,
                             text=True, timeout=20, check=False)
    assert unknown.returncode == 1
    assert "OSError: nobody/nothing is not a local folder" in unknown.stderr


@pytest.mark.parametrize("tp", [3])
def test_more_ranks_than_gpus_fails(sim_env: dict[str, str], tmp_path: Path, reaper: GroupReaper, tp: int) -> None:
    srv = Server(reaper, sim_env, tmp_path / "server.log", tp=tp)
    assert srv.proc.wait(timeout=15) != 0
    assert "invalid device ordinal" in srv.text()


def test_a_pre_rendered_token_event_is_the_same_bytes_as_rendering_it_whole() -> None:
    import json

    from app.sim.http_api import TEXT_MARK, event_around_text

    def chunk(text: str) -> dict[str, object]:
        return {"id": "r1", "object": "text_completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}], "usage": None}

    head, tail = event_around_text(chunk(TEXT_MARK))
    for text in ("", " word", 'a "quoted" \\ back\nslash', "naïve 日本 \x00 \u2028", TEXT_MARK * 2):
        assert head + json.dumps(text).encode() + tail == f"data: {json.dumps(chunk(text))}\n\n".encode()
