"""The dashboard's tune on parallel slots ("Tune on parallel slots…" in the palette, key ctrl+t): ask N, plan, open.

How many slots the host holds now is read first (app.core.measure.slots.slots_that_fit: one nvidia-smi snapshot,
GPUs anyone else holds left out) and offered in a ValuePrompt; the answer N is planned as `tunedash tune PROFILE
--slots N` plans it (plan_on_host), then the TuneScreen races on those slots. A plan that does not fit (N of 0, more
slots than fit, GPUs others hold) is refused with the CLI's own text as a notification, and nothing is launched; so
is a host with no second slot free, before anything is asked. N = 1 is the plain tune (`t`). A `slurm:` profile,
where a slot is an allocation of its own, is refused: `tunedash tune PROFILE --slots N` asks for the allocations.
"""

from __future__ import annotations

from app.core.errors import TunedashError
from app.core.hosts.slurm import SlurmHost
from app.core.measure.slots import plan_on_host, slots_that_fit
from app.tui.bench import Dashboard
from app.tui.tune import TuneScreen, start_tune
from app.tui.value_prompt import ValuePrompt


def ask_slots(dashboard: Dashboard) -> None:
    """"Tune on parallel slots…": how many fit, then ask N (the dashboard refused it already while read-only or
    busy)."""
    profile = dashboard.session.profile
    if profile.tune is None:
        start_tune(dashboard)  # says what is missing
        return
    if isinstance(dashboard.session.host, SlurmHost):
        dashboard.notify(f"{profile.name} is a slurm: profile, where each slot is an allocation of its own, which the "
                         f"dashboard does not ask for: run `tunedash tune {profile.name} --slots N` "
                         f"({dashboard.key_of('tune', 't')} tunes it here on one slot)", severity="warning")
        return
    dashboard.app.run_worker(_ask(dashboard), name="tune slots", group="tune-slots", exclusive=True,
                             exit_on_error=False)


def _refused(dashboard: Dashboard, exc: TunedashError) -> None:
    dashboard.notify(str(exc), title=exc.title, severity="error")


async def _ask(dashboard: Dashboard) -> None:
    session = dashboard.session
    profile = session.profile
    try:
        gpus, fit = await slots_that_fit(session.host, profile)
        if fit < 2:  # why not even two fit, in the CLI's words (plan_slots), before anything is asked
            await plan_on_host(session.host, profile, 2)
    except TunedashError as exc:
        _refused(dashboard, exc)
        return
    width = len(profile.gpus)
    help_text = (f"how many candidates race at once, each on its own slot of {width} adjacent GPUs and its own port "
                 f"(slot 0: the profile's GPUs {','.join(map(str, profile.gpus))} and port {profile.port}; slot i: "
                 f"the next free GPUs and port + i). {session.host.name} has {gpus} GPUs: {fit} slots fit now. "
                 f"1 is the plain tune ({dashboard.key_of('tune', 't')})")
    dashboard.app.push_screen(ValuePrompt("slots", help_text, str(fit), empty_help="empty or escape: no tune"),
                              lambda text: _answered(dashboard, text))


def _answered(dashboard: Dashboard, text: str | None) -> None:
    if text is None or not text.strip():
        return
    try:
        n = int(text.strip())
    except ValueError:
        dashboard.notify(f"--slots: expected a whole number of slots, got {text.strip()!r}", severity="error")
        return
    if n == 1:
        start_tune(dashboard)
        return
    refused = dashboard.refusal("tune_slots")  # a command may have started while the prompt was open
    if refused:
        dashboard.notify(refused, severity="warning")
        return
    dashboard.app.run_worker(_open(dashboard, n), name="tune slots plan", group="tune-slots", exclusive=True,
                             exit_on_error=False)


async def _open(dashboard: Dashboard, n: int) -> None:
    """Plan `n` slots on the host now; the TuneScreen on them, or the plan's refusal (nothing launched)."""
    session = dashboard.session
    try:
        slots = await plan_on_host(session.host, session.profile, n)
    except TunedashError as exc:
        _refused(dashboard, exc)
        return
    dashboard.app.push_screen(TuneScreen(dashboard, slots))
