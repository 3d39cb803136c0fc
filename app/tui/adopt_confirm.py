"""The one question before tunedash first signals a server it did not launch (docs/adopt.md): `r` and `k` on an
adopted server ask it, naming the pid, user, start time and command line as adopt read them. Yes counts for the
session (the server is relaunched under tunedash after that kill); another user's server is never asked about:
it is refused at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import App

from app.core.adopt.takeover import Adoption
from app.core.data import printable
from widgets import ConfirmModal


def ask_adopted(app: App[Any], adopted: Adoption, what: str, then: Callable[[], None]) -> None:
    """Ask whether `what` ("relaunch", "kill") may stop `adopted`; on yes mark it confirmed and call `then`."""
    if adopted.refusal:
        app.notify(f"{what} refused: pid {adopted.proof.pid} {adopted.refusal}; nothing was signalled",
                   severity="error")
        return

    def answered(yes: bool | None) -> None:
        if yes:
            adopted.confirmed = True
            then()

    verb = "Relaunch" if what == "relaunch" else "Kill"
    detail = "\n".join(printable(line) for line in adopted.ask(what).splitlines())
    app.push_screen(ConfirmModal(f"{verb} a server tunedash did not launch?", detail, yes_label=verb), answered)
