"""HTTP routes of the simulated SGLang server (aiohttp): health, server info, OpenAI streaming, metrics.

/get_server_info reports the resolved args under the release's real field names (what runs after its rules:
0.5.10 `disable_piecewise_cuda_graph`, 0.5.23 `cuda_graph_backend_prefill`, `disable_overlap_schedule`, ...)
and `version`, the release spoken.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from app.sim.engine import Engine, SimRequest
from app.sim.resolved import Running
from app.sim.simlog import log


class ServedServer(Protocol):
    """What the routes read of the server they serve (app.sim.sglang.SimServer is one)."""

    args: dict[str, Any]
    """The resolved server args, by SGLang's field names (`_`-prefixed ones are private)."""
    running: Running
    model: dict[str, Any]
    status: str
    """"Starting", "Up" or "Draining"."""
    max_total_tokens: int
    engine: Engine | None
    """None until the scheduler is up."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TEXT_MARK = "\x00tunedash-sim-text\x00"  # stands for a chunk's text while its JSON is rendered once (_generate)


def event_around_text(chunk: dict[str, Any]) -> tuple[bytes, bytes]:
    """The SSE event of `chunk` (whose text is TEXT_MARK) split around that text: head + json.dumps(text) + tail
    is exactly the event of the chunk with that text."""
    head, mark, tail = f"data: {json.dumps(chunk)}\n\n".partition(json.dumps(TEXT_MARK))
    if not mark:
        raise ValueError("the chunk carries no TEXT_MARK")
    return head.encode(), tail.encode()
SERVER_KEY: web.AppKey[ServedServer] = web.AppKey("server")


def _server(request: web.Request) -> ServedServer:
    return request.app[SERVER_KEY]


@web.middleware
async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
    resp = await handler(request)
    peer = request.transport.get_extra_info("peername") if request.transport else None
    who = f"{peer[0]}:{peer[1]}" if peer else "127.0.0.1:0"
    reason = resp.reason or ""
    log(f"INFO:     {who} - \"{request.method} {request.path} HTTP/1.1\" {resp.status} {reason}")
    return resp


async def health(request: web.Request) -> web.Response:
    srv = _server(request)
    if srv.status != "Up":
        if srv.status == "Draining":
            log("Health check request received during shutdown. Returning 503.")
        return web.Response(status=503)
    return web.Response(status=200)


def public_args(srv: ServedServer) -> dict[str, Any]:
    return {k: v for k, v in srv.args.items() if not k.startswith("_")}


async def server_info(request: web.Request) -> web.Response:
    srv = _server(request)
    eng = srv.engine
    state: dict[str, Any] = dict(public_args(srv))
    state["last_gen_throughput"] = eng.stats.last_gen_throughput if eng else 0.0
    tp = srv.args["tp_size"]
    state["memory_usage"] = {
        "weight": round(srv.model["weights_gib"] / tp, 2),
        "kvcache": round(srv.max_total_tokens * srv.model["kv_kib_per_token"] / tp / 1024 / 1024, 2),
        "token_capacity": srv.max_total_tokens,
        "graph": 0.66 if srv.running.decode_graph else 0.0,
    }
    accept = eng.avg_spec_accept_length() if eng else None
    if accept is not None:
        state["avg_spec_accept_length"] = accept
    info = dict(public_args(srv))
    info.update({
        "status": srv.status,
        "max_total_num_tokens": srv.max_total_tokens,
        "max_req_input_len": srv.args["context_length"] - 1,
        "internal_states": [state],
        "version": srv.running.version,
    })
    return web.json_response(info)


async def model_info(request: web.Request) -> web.Response:
    """/model_info (and the deprecated /get_model_info) with the fields of the release spoken, in its order:
    0.5.10-0.5.15 http_server.model_info, and from 0.5.23 also served_model_name, load_format, the parsers and
    disaggregation_mode (read from the real packages: scripts/sglang-cli-env)."""
    srv = _server(request)
    args = srv.args
    if request.path == "/get_model_info":
        log("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
            "Please use '/model_info' instead.")
    multimodal = bool(srv.model["multimodal"])
    info: dict[str, Any] = {"model_path": args["model_path"]}
    if srv.running.version != "0.5.10":
        info["served_model_name"] = args["served_model_name"]
    info.update({"tokenizer_path": args["tokenizer_path"], "is_generation": True,
                 "preferred_sampling_params": args.get("preferred_sampling_params"),
                 "weight_version": args.get("weight_version", "default")})
    if srv.running.version != "0.5.10":
        info.update({name: args.get(name) for name in ("load_format", "reasoning_parser", "tool_call_parser",
                                                       "disaggregation_mode")})
    info.update({"has_image_understanding": multimodal, "has_audio_understanding": False,
                 "model_type": srv.model["model_type"], "architectures": [srv.model["architecture"]]})
    return web.json_response(info)


async def models(request: web.Request) -> web.Response:
    srv = _server(request)
    name = srv.args["served_model_name"]
    return web.json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name,
         "max_model_len": srv.args["context_length"]}]})


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    else:
        prompt = body.get("prompt", body.get("text", ""))
        text = " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
    return max(1, len(text.split()) * 4 // 3)


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    srv = _server(request)
    if srv.status != "Up" or srv.engine is None:
        return web.json_response({"object": "error", "message": "server is not ready", "code": 503}, status=503)
    try:
        body = await request.json()
    except json.JSONDecodeError:
        return web.json_response({"object": "error", "message": "invalid JSON body", "code": 400}, status=400)
    default_max = 128 if chat else 16
    max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or default_max)
    model = srv.args["served_model_name"]
    rid = uuid.uuid4().hex
    req = SimRequest(rid=rid, prompt_tokens=_prompt_tokens(body), max_tokens=max(1, max_tokens))
    srv.engine.submit(req)
    created = int(time.time())
    kind = "chat.completion" if chat else "text_completion"
    usage = {"prompt_tokens": req.prompt_tokens, "completion_tokens": 0, "total_tokens": 0}

    def chunk(text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if finish:
            choice["matched_stop"] = None
        return {"id": rid, "object": kind + (".chunk" if chat else ""), "created": created, "model": model,
                "choices": [choice], "usage": None}

    if not body.get("stream"):
        parts = []
        try:
            while (piece := await req.chunks.get()) is not None:
                parts.append(piece)
        finally:
            srv.engine.abort(req)
        text = "".join(parts)
        usage.update(completion_tokens=req.generated, total_tokens=req.prompt_tokens + req.generated)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
        return web.json_response({"id": rid, "object": kind, "created": created, "model": model,
                                  "choices": [choice], "usage": usage})

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)

    async def send(obj: dict[str, Any] | str) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        await resp.write(f"data: {data}\n\n".encode())

    # A token chunk differs from the next only by its text: its JSON is rendered once around a marker and the
    # text's own json.dumps goes in between (the same bytes as json.dumps of the whole chunk, at a fraction of
    # the cost: tests/sim/test_sglang_server.py compares them).
    head_bytes, tail_bytes = event_around_text(chunk(TEXT_MARK, None))
    chunks = req.chunks

    try:
        if chat:
            await send(chunk(None, None, first=True))
        while True:
            piece = chunks.get_nowait() if not chunks.empty() else await chunks.get()
            if piece is None:
                break
            await resp.write(head_bytes + json.dumps(piece).encode() + tail_bytes)
        await send(chunk("" if not chat else None, "length"))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage.update(completion_tokens=req.generated, total_tokens=req.prompt_tokens + req.generated)
            await send({"id": rid, "object": kind + (".chunk" if chat else ""), "created": created,
                        "model": model, "choices": [], "usage": usage})
        await send("[DONE]")
    except (ConnectionResetError, RuntimeError):
        pass
    finally:
        srv.engine.abort(req)
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def health_generate(request: web.Request) -> web.Response:
    srv = _server(request)
    if srv.status != "Up" or srv.engine is None:
        return web.Response(status=503)
    req = SimRequest(rid=f"HEALTH_CHECK_{time.time()}", prompt_tokens=1, max_tokens=1)
    srv.engine.submit(req)
    while await req.chunks.get() is not None:
        pass
    return web.Response(status=200)


def _gauge_lines(srv: ServedServer) -> str:
    eng = srv.engine
    assert eng is not None
    labels = f'engine_type="unified",model_name="{srv.args["served_model_name"]}",pp_rank="0",tp_rank="0"'
    st = eng.stats
    gauges = {
        "num_running_reqs": st.running, "num_used_tokens": st.used_tokens,
        "token_usage": st.used_tokens / max(srv.max_total_tokens, 1), "gen_throughput": st.last_gen_throughput,
        "num_queue_reqs": st.queued, "cache_hit_rate": 0.0, "spec_accept_length": eng.avg_spec_accept_length() or 0.0,
        "max_total_num_tokens": srv.max_total_tokens, "is_cuda_graph": 1.0 if srv.running.decode_graph else 0.0,
    }
    out = []
    for name, value in gauges.items():
        out += [f"# HELP sglang:{name} {name.replace('_', ' ')}.", f"# TYPE sglang:{name} gauge",
                f"sglang:{name}{{{labels}}} {float(value)}"]
    out += ["# HELP sglang:realtime_tokens_total Total number of tokens processed, updated on each log interval.",
            "# TYPE sglang:realtime_tokens_total counter",
            f'sglang:realtime_tokens_total{{{labels},mode="decode"}} {float(st.realtime_decode_tokens)}']
    tok_labels = f'model_name="{srv.args["served_model_name"]}"'
    for name, value in (("prompt_tokens_total", st.prompt_tokens_total),
                        ("generation_tokens_total", st.generation_tokens_total),
                        ("num_requests_total", st.num_requests_total)):
        out += [f"# HELP sglang:{name} {name.replace('_', ' ')}.", f"# TYPE sglang:{name} counter",
                f"sglang:{name}{{{tok_labels}}} {float(value)}"]
    return "\n".join(out) + "\n"


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=_gauge_lines(_server(request)), content_type="text/plain")


def build_app(server: ServedServer) -> web.Application:
    app = web.Application(middlewares=[access_log])
    app[SERVER_KEY] = server
    r = app.router
    r.add_get("/health", health)
    r.add_get("/health_generate", health_generate)
    r.add_get("/get_server_info", server_info)
    r.add_get("/server_info", server_info)
    r.add_get("/get_model_info", model_info)
    r.add_get("/model_info", model_info)
    r.add_get("/v1/models", models)
    r.add_post("/v1/completions", completions)
    r.add_post("/v1/chat/completions", chat_completions)
    if server.args["enable_metrics"]:
        r.add_get("/metrics", metrics)
    return app
