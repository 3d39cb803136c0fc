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
from app.core.advisor.rules import fix_text
from app.core.errors import TunedashError
from app.core.hosts.base import HostError
from app.tui.bench import BenchKeys
from widgets.advisor_screen import AdvisorChoice, AdvisorScreen


class AdvisorKeys(BenchKeys):
    """The advisor key of the dashboard (TunedashApp inherits this class)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("v", "advise", "Advise", id="advise",
                tooltip="Advisor: flags slower than the best recorded run, features left off (with the evidence)"),
    ]

    def _push_flags(self) -> None:
        """The Flags panel now (TunedashApp's)."""

    def refusal(self, action: str, parameters: tuple[object, ...] = ()) -> str | None:
        """Why the dashboard refuses `action` now, or None (TunedashApp's check_action rule)."""
        return None

    def flag_refusal(self, name: str) -> str | None:
        """Why flag `name` may not be changed here, or None (TunedashApp's)."""
        return None

    def action_advise(self) -> None:
        if not self._server_ready("the advisor"):
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
        except (HostError, TunedashError) as exc:  # a worker's error would otherwise vanish
            self.notify(str(exc), title="advisor", severity="error")
            return
        finally:
            if store is not None:
                store.close()
        fixes = advice.pending()
        found = [f.title for f in (*advice.slower_than_before, *advice.left_on_table) if f.status == "fix"]
        session.note(f"advisor: {len(found)} fix(es) found" + (f": {', '.join(found)}" if found else ""))
        self.push_screen(AdvisorScreen(advice_text(advice), fix_text(fixes)),
                         lambda choice: self._advised(advice, choice))

    def _advised(self, advice: Advice, choice: AdvisorChoice | None) -> None:
        if choice is None:
            return
        session = self.session
        running = session.profile
        fixes = advice.pending()
        kept = {name: value for name, value in fixes.items() if self.flag_refusal(name) is None}
        refused = next((self.flag_refusal(name) for name in fixes if name not in kept), None)
        if choice == "ab":
            refused = self.refusal("ab") or refused
        if refused:  # a read-only dashboard, or a fix outside the tuning flags: said, and nothing half done
            self.notify(refused, severity="warning")
            if choice == "ab" or not kept:
                return
        for name, value in kept.items():
            session.set_pending_flag(name, value)
        session.note(f"advisor: applied as pending: {fix_text(kept)} (r relaunches)")
        self._push_flags()
        if choice == "ab":
            self.baseline = running
            self.action_ab()
