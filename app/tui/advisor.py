"""The dashboard's advisor key `v`: what is slower than before and what is left on the table, in one screen.

`v` is the DashboardScreen's own binding; its action runs `advise(dashboard)` here in a worker. The advice comes
from app.core.advisor (the same as `tunedash advise`); `a` on the screen sets every fix as pending flags (shown in
the Flags panel and `d`, nothing launches until `r`), `b` sets them and runs the A/B of the running config (A)
against them (B), as the command in the Session's one slot (app.tui.bench.start_ab). The event log records what the
advisor found and what was applied.
"""

from __future__ import annotations

from app.core.advisor.advise import Advice, NothingRunning, advice_text
from app.core.advisor.advise import advise as advise_server
from app.core.advisor.rules import fix_text
from app.core.errors import TunedashError
from app.core.hosts.base import HostError
from app.tui.bench import Dashboard, open_store, start_ab
from widgets.advisor_screen import AdvisorChoice, AdvisorScreen


async def advise(dashboard: Dashboard) -> None:
    """`v`: ask the advisor about the running server, then show its advice (the dashboard checked READY)."""
    session = dashboard.session
    store = open_store(dashboard)
    try:
        advice = await advise_server(session.host, session.profile, store=store)
    except NothingRunning as exc:
        dashboard.notify(str(exc), severity="warning")
        return
    except (HostError, TunedashError) as exc:  # a worker's error would otherwise vanish
        dashboard.notify(str(exc), title="advisor", severity="error")
        return
    finally:
        if store is not None:
            store.close()
    fixes = advice.pending()
    found = [f.title for f in (*advice.slower_than_before, *advice.left_on_table) if f.status == "fix"]
    session.note(f"advisor: {len(found)} fix(es) found" + (f": {', '.join(found)}" if found else ""))
    dashboard.app.push_screen(AdvisorScreen(advice_text(advice), fix_text(fixes)),
                              lambda choice: advised(dashboard, advice, choice))


def advised(dashboard: Dashboard, advice: Advice, choice: AdvisorChoice | None) -> None:
    """The advisor screen's answer: apply the fixes as pending flags, and for `b` start their A/B."""
    if choice is None:
        return
    session = dashboard.session
    running = session.profile
    fixes = advice.pending()
    kept = {name: value for name, value in fixes.items() if dashboard.flag_refusal(name) is None}
    refused = next((dashboard.flag_refusal(name) for name in fixes if name not in kept), None)
    if choice == "ab":
        refused = dashboard.refusal("ab") or refused
    if refused:  # a read-only dashboard, a command in progress, a fix outside the tuning flags: nothing half done
        dashboard.notify(refused, severity="warning")
        if choice == "ab" or not kept:
            return
    for name, value in kept.items():
        session.set_pending_flag(name, value)
    session.note(f"advisor: applied as pending: {fix_text(kept)} ({dashboard.key_of('relaunch', 'r')} relaunches)")
    dashboard.push_flags()
    if choice == "ab":
        dashboard.baseline = running
        start_ab(dashboard)
