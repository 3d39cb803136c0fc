"""The dashboard's answer to an unknown SSH host key: show its fingerprint in a ConfirmModal and ask.

`install_trust_prompt(app, host)` gives the host a prompt (Host.set_trust_prompt); SshHost calls it when
known_hosts does not know the server's key, writes the known_hosts line on yes, and refuses on no. A
*changed* key never reaches this prompt: it is always refused.
"""

from __future__ import annotations

import asyncio

from textual.app import App

from app.core.hosts.base import Host
from app.core.hosts.ssh_trust import TrustRequest
from widgets.confirm_modal import ConfirmModal


def install_trust_prompt(app: App[None], host: Host) -> None:
    """Let `host` ask the person at `app` about an unknown host key."""

    async def ask(request: object) -> bool:
        if not isinstance(request, TrustRequest):
            return False
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
