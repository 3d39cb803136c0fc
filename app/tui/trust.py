"""The dashboard's answer to an unknown SSH host key: show its fingerprint in a ConfirmModal and ask.

`install_trust_prompt(app, host, asks)` gives the host a prompt (Host.set_trust_prompt); SshHost calls it when
known_hosts does not know the server's key, writes the known_hosts line on yes, and refuses on no. A
*changed* key never reaches this prompt: it is always refused. While `asks()` is false (a dashboard that only
watches: `--readonly`, or `--watch` until T) nobody is asked: the connection fails as the CLI's does, saying the
key is unknown and to run `tunedash trust HOST`, and is tried again later (then asking, once the dashboard drives).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from textual.app import App

from app.core.hosts.base import Host
from app.core.hosts.ssh_trust import HostKeyUnknown, TrustRequest, unknown_message
from widgets.confirm_modal import ConfirmModal


def install_trust_prompt(app: App[None], host: Host, asks: Callable[[], bool] = lambda: True) -> None:
    """Let `host` ask the person at `app` about an unknown host key, whenever `asks()` says they may answer."""

    async def ask(request: object) -> bool:
        if not isinstance(request, TrustRequest):
            return False
        if not asks():  # raised, not answered no: a no is final for the host, and the dashboard may drive later
            raise HostKeyUnknown(f"{unknown_message(request)} (a read-only dashboard never adds a host key)",
                                 request)
        where = request.host if not request.jump_for else f"{request.host}, the jump host to {request.jump_for}"
        fingerprint, file = request.fingerprint, request.known_hosts_file
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def answered(result: bool | None) -> None:
            if not answer.done():
                answer.set_result(bool(result))

        detail = (f"{where} presents {fingerprint}, which is not in {file}. Compare it with the host's own key "
                  "(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on the host). Trust it and add it there?")
        app.push_screen(ConfirmModal(f"Unknown SSH host key: {where}", detail, yes_label="Trust"), answered)
        return await answer

    host.set_trust_prompt(ask)
