"""The probe's failure is shown (issue: safe on a shared GPU host): a server that keeps answering errors turns the
header's "probe on" into "probe failing (N)" and puts one line in the event log; it recovers by itself."""

from __future__ import annotations

import asyncio

from aiohttp import web

from app.core.data import ServerState
from app.core.measure.probe import ProbeStatus
from app.core.profiles.loading import load_profile
from app.core.session import Session
from app.tui.views import probe_note
from tests.fakes import InMemoryHost, ScriptedTelemetry, gpu_reading
from tests.helpers import REPO, serving, until


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
    profile = load_profile(REPO / "profiles" / "demo.toml")
    async with serving(app) as port:
        session = Session(ForwardingHost(port), profile, telemetry=ScriptedTelemetry(gpu_reading({})))
        try:
            session.lifecycle.state = ServerState.READY  # as if the server were up: the probe runs only then
            session.set_probe(True)
            await until(lambda: session.probe_status is not None and session.probe_status.state == "failing", 20,
                        "the probe to say it is failing")
            assert probe_note(True, session.probe_status).startswith(" · probe failing (")
            texts = [e.text for e in session.events]
            failing = [t for t in texts if "probe failing" in t]
            assert len(failing) == 1 and "503" in failing[0]
            healthy["now"] = True
            await until(lambda: session.probe_status is not None and session.probe_status.state == "running", 40,
                        "the probe to answer again")
            assert probe_note(True, session.probe_status) == " · probe on"
            assert "probe answering again" in [e.text for e in session.events]
        finally:
            session.set_probe(False)


def test_the_header_note_of_each_probe_state() -> None:
    assert probe_note(False, ProbeStatus("failing", 3, "HTTP 503")) == ""
    assert probe_note(True, None) == " · probe on"
    assert probe_note(True, ProbeStatus("failing", 4, "HTTP 503", 8.0)) == " · probe failing (4)"
    assert probe_note(True, ProbeStatus("stopped", 0, "cannot open the port forward")) == " · probe stopped"
