"""The fleet poller over real hosts: a host that accepts TCP but never speaks SSH shows its timeout and never holds
up the simulated host beside it; a READY server's row has its state, time in state, GPU memory and version."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from app.connect import fleet_hosts
from app.core.data import ServerState
from app.core.fleet import FleetPoller
from app.core.hosts.base import Host
from app.core.profiles.loading import load_profile
from tests.helpers import MakeProfile, tunedash, until


async def test_a_silent_host_never_blocks_the_others(make_profile: MakeProfile, tmp_path: Path) -> None:
    silent_peers: list[asyncio.StreamWriter] = []

    async def accept_and_say_nothing(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent_peers.append(writer)

    server = await asyncio.start_server(accept_and_say_nothing, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ready = make_profile(name="up")
    launched = tunedash("launch", str(ready), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    silent = tmp_path / "silent.toml"
    silent.write_text(f'name = "silent"\nhost = "ssh://nobody@127.0.0.1:{port}"\nbackend = "sglang"\nmodel = "m"\n'
                      "port = 30000\ngpus = [0]\n")
    pairs = fleet_hosts([load_profile(ready), load_profile(silent)])
    members = [(p, h) for p, h in pairs if isinstance(h, Host)]
    poller = FleetPoller(members, look_period_s=0.3, timeout_s=1.0)
    poller.start()
    try:
        def rows() -> dict[str, object]:
            return {row.profile: row for row in poller.rows()}

        await until(lambda: rows()["up"].state == ServerState.READY  # type: ignore[attr-defined]
                    and rows()["up"].gpus[0].used_mib  # type: ignore[attr-defined]
                    and rows()["up"].version is not None,  # type: ignore[attr-defined]  # discovery runs on its own
                    20, "the READY row with its GPU memory and version")
        await until(lambda: "no answer within 1 s" in rows()["silent"].error, 10,  # type: ignore[attr-defined]
                    "the silent host's timeout", lambda: str(rows()["silent"]))
        up, quiet = poller.rows()  # sorted by host: "sim" < "ssh://..."
        assert (up.profile, quiet.profile) == ("up", "silent")
        assert up.version == "0.5.10" and up.since is not None and up.connection == "local"
        assert [g.used_mib for g in up.gpus] and all(g.total_mib for g in up.gpus)
        assert quiet.state is None and quiet.connection == "unreachable"
        before = poller.looks
        await until(lambda: poller.looks >= before + 3, 5, "more looks while the silent host stays silent")
    finally:
        await poller.stop()
        for _p, host in members:
            await host.close()
        for writer in silent_peers:
            writer.close()
        server.close()


async def test_a_server_ready_before_the_fleet_looked_is_ready_from_the_first_look(make_profile: MakeProfile,
                                                                                   sim_state: Path) -> None:
    """The fleet started after the server became READY showed "LAUNCHING" with the time since the launch until its
    log follow caught up, then "READY" counted from that moment: neither was the server's state or its time."""
    profile = make_profile(name="early")
    launched = tunedash("launch", str(profile), "--wait", "--timeout", "60")
    ready_by = time.time()
    assert launched.returncode == 0, launched.stdout + launched.stderr
    launched_at = json.loads(next((sim_state / "host" / "jobs").glob("early-*.json")).read_text())["launched_at"]
    await asyncio.sleep(1.5)
    pairs = fleet_hosts([load_profile(profile)])
    members = [(p, h) for p, h in pairs if isinstance(h, Host)]
    poller = FleetPoller(members, look_period_s=0.3)
    seen: list[tuple[ServerState | None, float | None]] = []
    poller.start()
    try:
        while poller.looks < 5:
            row = poller.rows()[0]
            if row.state is not None:
                seen.append((row.state, row.since))
            await asyncio.sleep(0.02)
    finally:
        await poller.stop()
        for _p, host in members:
            await host.close()
    assert seen and {state for state, _ in seen} == {ServerState.READY}, seen[:3]
    assert all(since is not None and launched_at <= since <= ready_by for _, since in seen), (launched_at, ready_by,
                                                                                              seen[:3])
