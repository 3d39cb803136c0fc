"""The fleet's Enter/Escape x 20 on one shared SSH host, with a reconnect in between (issue 25, item 3): each
dashboard opened from the fleet (a Session on the fleet's Host) unsubscribes from the host's connection events
when it closes, so after a reconnect only the fleet (and the dashboard open now) hear of it, and no closed
dashboard re-attaches to the server."""

from __future__ import annotations

import asyncio

import pytest

from app.core.data import ServerState
from app.core.fleet import FleetPoller
from app.core.hosts.base import ConnectionChanged
from app.core.profiles.loading import resolve_profile
from app.core.server.events import LifecycleEvent
from app.core.session import Session
from tests.helpers import until
from tests.integration.sshd import Sshd
from tests.integration.test_ssh_session import make_host

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _reconnected(events: list[ConnectionChanged], after: int) -> bool:
    return any(e.state == "connected" and e.since is not None for e in events[after:])


async def test_fleet_enter_escape_20_times_with_a_reconnect_leaves_one_listener(sshd: Sshd,
                                                                                   ssh_profile) -> None:
    profile = resolve_profile(str(ssh_profile(name="fleet-listeners")))
    host = make_host(profile, sshd)
    fleet_heard: list[ConnectionChanged] = []
    poller = FleetPoller([(profile, host)], look_period_s=0.5)
    poller.start()
    unsubscribe_probe = host.subscribe_connection(fleet_heard.append)  # what the fleet hears, to wait on
    server = Session(host, profile, sample_period_ms=500)
    await server.start()
    await server.launch()
    assert await server.lifecycle.wait_ready(60) == ServerState.READY
    await server.stop()  # the server keeps running: every dashboard below re-attaches to it
    closed: list[tuple[Session, list[LifecycleEvent], int]] = []
    try:
        await until(lambda: host.connection_listeners == 2, 10, "the fleet and the probe only")
        for round_ in range(20):  # Enter opens the dashboard on the fleet's host, Escape closes it
            dashboard = Session(host, profile, sample_period_ms=500)
            heard: list[LifecycleEvent] = []
            dashboard.lifecycle.subscribe(heard.append)
            await dashboard.start()
            assert host.connection_listeners == 3  # the fleet, the probe, this dashboard
            assert dashboard.lifecycle.state == ServerState.READY
            await dashboard.stop()
            closed.append((dashboard, heard, len(heard)))
            if round_ == 9:  # the connection drops and comes back between two visits
                mark = len(fleet_heard)
                assert sshd.drop_connections() >= 1
                await until(lambda at=mark: _reconnected(fleet_heard, at), 30, "the reconnect")
        assert host.connection_listeners == 2  # the fleet's (and the probe's): no closed dashboard is left
        mark = len(fleet_heard)
        assert sshd.drop_connections() >= 1
        await until(lambda: _reconnected(fleet_heard, mark), 30, "the second reconnect")
        await asyncio.sleep(1.0)  # time for a closed dashboard to re-attach, if one still listened
        talked = [i for i, (_, heard, at_close) in enumerate(closed) if len(heard) != at_close]
        assert not talked, (f"closed dashboards {talked} still heard the host and re-attached: "
                            f"{[type(e).__name__ for e in closed[talked[0]][1][closed[talked[0]][2]:]][:8]}")
    finally:
        unsubscribe_probe()
        await poller.stop()
        cleanup = Session(host, profile, sample_period_ms=500)
        await cleanup.start()
        await cleanup.lifecycle.kill(confirm_free=False)
        await cleanup.stop()
        await host.close()
