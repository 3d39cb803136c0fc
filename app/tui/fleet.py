"""The fleet screen: one row per server of many profiles on many hosts, refreshed at 1 Hz; Enter opens a row's
full dashboard, Escape there comes back.

`run_fleet(members)` is the whole loop `tunedash fleet` runs in one event loop: the FleetPoller (app.core.fleet)
starts once and keeps following every host; the FleetApp shows it and exits with the key of the row Enter was
pressed on; the dashboard for that row (create_app, on the fleet's own Host, so an SSH connection is shared) runs
until Escape (back to a fresh FleetApp, the cursor on the same row) or q (everything ends). Why two apps in turn
rather than the dashboard as a pushed screen: docs/architecture.md#the-fleet.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Header, Static
from textual.widgets.data_table import RowDoesNotExist

from app.core.fleet import FleetPoller, FleetRow
from app.core.hosts.base import Host, HostError
from app.core.hosts.ssh_options import SshTarget
from app.core.profiles.types import Profile
from widgets.fleet_table import FleetRowView, FleetTable

log = logging.getLogger("tunedash")

FLEET_PERIOD_S = 1.0
"""The fleet table is refreshed once a second (the poller's values change no faster)."""


def short_host(name: str) -> str:
    """ "gpubox:2222" for "ssh://alice@gpubox:2222" (the table's host column); other names as they are."""
    if not name.startswith("ssh://"):
        return name
    try:
        target = SshTarget.parse(name)
    except HostError:
        return name
    return f"{target.host}:{target.port}" if target.port else target.host


def fleet_row_view(row: FleetRow) -> FleetRowView:
    """The table's data for one of the poller's rows."""
    fractions = tuple(
        gpu.used_mib / gpu.total_mib if gpu.used_mib is not None and gpu.total_mib else None for gpu in row.gpus
    )
    return FleetRowView(
        key=row.key, host=short_host(row.host), server=row.profile,
        backend=f"{row.backend} {row.version}" if row.version else row.backend,
        state=row.state, since=int(row.since) if row.since is not None else None,
        tokens_per_s=row.tokens_per_s, accept_len=row.accept_len, gpu_fractions=fractions,
        connection=row.connection, driver=row.driver,
    )


def problems_text(rows: Sequence[FleetRow], broken: Sequence[str]) -> str:
    """The lines under the table: each row's error (a host's names the host), each host's GPU error once, the
    profiles that could not be read at all."""
    lines: list[str] = []
    seen: set[str] = set()
    for row in rows:
        gpus = row.gpu_error if row.gpu_error != "not read yet" and row.gpus else ""
        for text, said in ((row.error, f"{row.profile}: {row.error}"),
                           (gpus, f"{short_host(row.host)}: GPUs not read: {gpus}")):
            if text and text not in seen:  # a host's error once, however many profiles it has
                seen.add(text)
                lines.append(said)
    lines.extend(broken)
    return "\n".join(lines)


class FleetApp(App[str | None]):
    """The fleet table over a running FleetPoller; exits with the key of the row to open (None: quit)."""

    TITLE = "tunedash fleet"
    CSS = """
    #problems { height: auto; max-height: 8; color: $error; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit", id="quit", tooltip="Quit (every server keeps running)"),
    ]

    def __init__(self, poller: FleetPoller, *, broken: Sequence[str] = (), selected: str | None = None) -> None:
        super().__init__()
        self.poller = poller
        self.broken = list(broken)
        self._selected = selected
        self._problems = ""

    def compose(self) -> ComposeResult:
        yield Header()
        yield FleetTable(id="fleet")
        yield Static("", id="problems")
        yield Footer()

    def on_mount(self) -> None:
        hosts = len(self.poller.hosts)
        self.sub_title = f"{sum(len(h.watches) for h in self.poller.hosts)} servers on {hosts} hosts"
        self.poller.start()
        self.refresh_rows()
        table = self.query_one(FleetTable)
        if self._selected is not None:
            with contextlib.suppress(RowDoesNotExist):  # the row left the fleet meanwhile: the cursor stays at the top
                table.move_cursor(row=table.get_row_index(self._selected))
        table.focus()
        self.set_interval(FLEET_PERIOD_S, self.refresh_rows)

    def refresh_rows(self) -> None:
        """Push the poller's rows to the table (only changed cells) and the problems under it."""
        rows = self.poller.rows()
        with self.batch_update():
            self.query_one(FleetTable).update([fleet_row_view(row) for row in rows], int(time.time()))
            text = problems_text(rows, self.broken)
            if text != self._problems:
                self._problems = text
                self.query_one("#problems", Static).update(text)

    def on_fleet_table_opened(self, message: FleetTable.Opened) -> None:
        self.exit(message.key)

    async def action_quit(self) -> None:
        self.exit(None)


async def run_fleet(members: Sequence[tuple[Profile, Host]], broken: Sequence[str] = (),
                    poller: FleetPoller | None = None) -> None:
    """The fleet until q: the table, a row's dashboard on Enter, back on Escape (module docstring). Every host in
    `members` is closed at the end; the servers keep running."""
    from app.tui.app import create_app

    poller = poller or FleetPoller(members)
    by_key = {str(profile.source): (profile, host) for profile, host in members}
    selected: str | None = None
    try:
        while True:
            key = await FleetApp(poller, broken=broken, selected=selected).run_async()
            if key is None or key not in by_key:
                return
            selected = key
            profile, host = by_key[key]
            dashboard = create_app(profile, host=host, fleet=True)
            try:
                await dashboard.run_async()
            finally:
                host.set_trust_prompt(None)  # the dashboard's prompt asked a screen that is gone now
            if not dashboard.back_to_fleet:
                return
            poller.look_soon()  # the dashboard gave its driver lock back: the row should say so now
    finally:
        await poller.stop()
        for host in {id(h): h for _p, h in members}.values():
            try:
                await host.close()
            except Exception as exc:  # the fleet is ending: a host that fails to close is named, the others still close
                log.warning("closing %s failed: %s", host.name, exc)
