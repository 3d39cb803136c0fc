"""One listener that raises never stops the others, and its failure is said in the event log (issue 25, item 3):
a dashboard's Session and its lifecycle on the simulated host, with a broken listener subscribed first."""

from __future__ import annotations

from app.connect import host_for
from app.core.data import ServerState
from app.core.profiles.loading import load_profile
from app.core.server.events import LifecycleEvent, StateChanged
from app.core.session import Session
from tests.helpers import MakeProfile, until


def _broken(event: LifecycleEvent) -> None:
    raise RuntimeError("this listener is broken")


def _ready(seen: list[LifecycleEvent]) -> bool:
    return any(isinstance(e, StateChanged) and e.state == ServerState.READY for e in seen)


async def test_a_lifecycle_listener_that_raises_does_not_stop_the_launch_or_the_next_listener(
        make_profile: MakeProfile) -> None:
    profile = load_profile(make_profile(startup_s=0.3))
    session = Session(host_for(profile), profile)
    await session.start()
    try:
        session.lifecycle.subscribe(_broken)  # after the Session's own listener: it must still see everything
        seen: list[LifecycleEvent] = []
        session.lifecycle.subscribe(seen.append)
        await session.launch()
        assert await session.lifecycle.wait_ready(30) == ServerState.READY
        assert _ready(seen)  # the listener after the broken one got every event
        texts = [e.text for e in session.events if e.level == "error"]
        assert any("a listener (_broken) failed on StateChanged: RuntimeError: this listener is broken" in t
                   for t in texts), texts  # the event log says which listener failed, and how
    finally:
        await session.lifecycle.kill(confirm_free=False)
        await session.stop()


async def test_a_session_listener_that_raises_does_not_stop_the_next_one(make_profile: MakeProfile) -> None:
    profile = load_profile(make_profile(startup_s=0.3))
    session = Session(host_for(profile), profile)
    session.subscribe(_broken)
    seen: list[LifecycleEvent] = []
    session.subscribe(seen.append)
    await session.start()
    try:
        await session.launch()
        await until(lambda: _ready(seen), 30, "READY through the second listener")
        assert session.lifecycle.state == ServerState.READY
        failures = [e.text for e in session.events if e.level == "error" and "_broken" in e.text]
        assert failures and "a listener" in failures[0]  # said in the event log, not only in a logger
    finally:
        await session.lifecycle.kill(confirm_free=False)
        await session.stop()
