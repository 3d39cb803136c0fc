"""The dashboard's advisor key `v`: what is slower than before and what is left on the table, in one screen.

AdvisorKeys is an App base class (TunedashApp inherits it, as BenchKeys, whose A/B it reuses). The advice comes
from app.core.advisor (the same as `tunedash advise`); `a` on the screen sets every fix as pending flags (shown in
the Flags panel and `d`, nothing launches until `r`), `b` sets them and runs the A/B of the running config (A)
against them (B). The event log records what the advisor found and what was applied.
"""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType

from app.core.advisor.advise import Advice, NothingRunning, advice_text, advise
from app.core.advisor.rules import PendingFlags
from app.core.data import ServerState
from app.tui.bench import BenchKeys
from widgets.advisor_screen import AdvisorChoice, AdvisorScreen


def fixes_text(fixes: PendingFlags) -> str:
    """"--enable-single-batch-overlap, unset --disable-overlap-schedule" for people."""
    return ", ".join(f"unset --{name}" if value is None else f"--{name}" if value is True else
                     f"--{name} {value}" for name, value in fixes.items())


class AdvisorKeys(BenchKeys):
    """The advisor key of the dashboard (TunedashApp inherits this class)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("v", "advise", "Advise", id="advise",
                tooltip="Advisor: flags slower than the best recorded run, features left off (with the evidence)"),
    ]

    def action_advise(self) -> None:
        if self.session.view().state != ServerState.READY:
            self.notify("the advisor reads a running server: press r to launch it first", severity="warning")
            return
        self.run_worker(self._advise(), name="advise", exit_on_error=False)

    async def _advise(self) -> None:
        session = self.session
        store = self._open_store()
        try:
            advice = await advise(session.host, session.profile, store=store)
        except NothingRunning as exc:
            self.notify(str(exc), severity="warning")
            return
        finally:
            if store is not None:
                store.close()
        fixes = advice.pending()
        found = [f.title for f in (*advice.slower_than_before, *advice.left_on_table) if f.status == "fix"]
        session.note(f"advisor: {len(found)} fix(es) found" + (f": {', '.join(found)}" if found else ""))
        self.push_screen(AdvisorScreen(advice_text(advice), fixes_text(fixes)),
                         lambda choice: self._advised(advice, choice))

    def _advised(self, advice: Advice, choice: AdvisorChoice | None) -> None:
        if choice is None:
            return
        session = self.session
        running = session.profile
        fixes = advice.pending()
        for name, value in fixes.items():
            session.set_pending_flag(name, value)
        session.note(f"advisor: applied as pending: {fixes_text(fixes)} (r relaunches)")
        self.refresh()
        if choice == "ab":
            self.baseline = running
            self.action_ab()
