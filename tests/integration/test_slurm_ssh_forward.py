"""Slurm reached over SSH (the login node) with the server's step on another node: HTTP goes through a forward
over the login node's real sshd (tests/integration/sshd.py) to NODE:PORT as the login node reaches it. One machine
has one node, named as its login host, so the other node here is an address only the forward's destination can
reach: a server bound to 127.0.0.2 alone, a name the login node ("vm", 127.0.0.1) is not. The allocation is that
edge too (`where` answers the job and node), since the one-node cluster cannot place a step on a second node."""

from __future__ import annotations

import tempfile

import aiohttp
import pytest
from aiohttp import web

from app.core.hosts.slurm import SlurmHost
from app.core.hosts.slurm_request import SlurmRequest
from app.core.hosts.ssh import SshHost
from tests.integration.sshd import Sshd

NODE = "127.0.0.2"  # the other node's address: loopback, but not the login node's 127.0.0.1


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="the server on the node")


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
        return await resp.text()


async def test_http_reaches_a_server_on_another_node_through_the_login_node(sshd: Sshd) -> None:
    app = web.Application()
    app.router.add_get("/health", _hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, NODE, 0)  # only the node's address: 127.0.0.1 does not answer on this port
    await site.start()
    port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    login = SshHost(sshd.spec, state_dir=tempfile.mkdtemp(prefix="tunedash-fwd-"), options=sshd.options())
    host = SlurmHost("slurm://login", SlurmRequest(login=sshd.spec, job=7), login=login)

    async def where() -> tuple[int, str]:
        return 7, NODE

    host.where = where  # type: ignore[method-assign]
    try:
        assert (await login.boot_identity()).hostname != NODE  # the step's node is not the login node
        url = await host.http_base(port)
        assert url.startswith("http://127.0.0.1:") and not url.endswith(f":{port}")  # a local forward
        assert await _get(url + "/health") == "the server on the node"
        with pytest.raises(aiohttp.ClientError):  # the login node's own port: what http_base gave before
            await _get(await login.http_base(port) + "/health")
        assert await host.http_base(port) == url  # one forward per node and port, kept
    finally:
        await host.close()
        await runner.cleanup()

