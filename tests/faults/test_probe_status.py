"""The probe's failure is shown (issue: safe on a shared GPU host): a server that keeps answering errors turns the
header's "probe on" into "probe failing (N)" and puts one line in the event log; it recovers by itself."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from aiohttp import web

from app.core.data import ServerState
from app.core.measure.probe import ProbeStatus
from app.core.profiles.loading import load_profile
from app.core.session import Session
from app.tui.views import probe_note
from tests.fakes import InMemoryHost, ScriptedTelemetry, gpu_reading

REPO = Path(__file__).resolve().parents[2]


class ForwardingHost(InMemoryHost):
    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port

    async def http_base(self, port: int) -> str:
        return f"http://127.0.0.1:{self.port}"


async def test_a_failing_probe_is_said_and_shown_then_recovers() -> None:
    healthy = {"now": False}

    async def complete(request: web.Request) -> web.StreamResponse:
        if not healthy["now"]:
            return web.Response(status=503, text="overloaded")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(8):
            await response.write(b'data: {"choices":[{"text":"ab "}]}\n\n')
            await asyncio.sleep(0.08)
        await response.write(b'data: {"choices":[],"usage":{"completion_tokens":16}}\n\ndata: [DONE]\n\n')
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    profile = load_profile(REPO / "profiles" / "demo.toml")
    session = Session(ForwardingHost(port), profile, telemetry=ScriptedTelemetry(gpu_reading({})))
    try:
        session.lifecycle.state = ServerState.READY  # as if the server were up: the probe runs only then
        session.set_probe(True)
        deadline = time.monotonic() + 20
        while not (session.probe_status and session.probe_status.state == "failing"):
            assert time.monotonic() < deadline, session.probe_status
            await asyncio.sleep(0.05)
        assert probe_note(True, session.probe_status).startswith(" · probe failing (")
        texts = [e.text for e in session.events]
        assert sum("probe failing" in t for t in texts) == 1 and "503" in next(t for t in texts if "probe failing" in t)
        healthy["now"] = True
        deadline = time.monotonic() + 40
        while session.probe_status.state != "running":
            assert time.monotonic() < deadline, session.probe_status
            await asyncio.sleep(0.05)
        assert probe_note(True, session.probe_status) == " · probe on"
        assert any(t == "probe answering again" for t in (e.text for e in session.events))
    finally:
        session.set_probe(False)
        await runner.cleanup()


def test_the_header_note_of_each_probe_state() -> None:
    assert probe_note(False, ProbeStatus("failing", 3, "HTTP 503")) == ""
    assert probe_note(True, None) == " · probe on"
    assert probe_note(True, ProbeStatus("failing", 4, "HTTP 503", 8.0)) == " · probe failing (4)"
    assert probe_note(True, ProbeStatus("stopped", 0, "cannot open the port forward")) == " · probe stopped"
