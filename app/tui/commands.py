"""Command palette: every flag of the backend's catalog can be set, not only the ones with keys.

The provider asks the app that lists it for what it needs through FlagEditor (the session, and why a flag may not
be changed there), never by importing the app. A dashboard that only watches offers no flag; one opened with
`--tuning-flags-only` (each `tunedash serve` tab) offers only the catalog's tuning flags (catalog.TUNING_FLAGS).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Protocol, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from app.core.flags.catalog import FlagSpec
from app.core.flags.discovery import offered_catalog
from app.core.flags.values import FlagError, format_value, get_flag, parse_value
from app.tui.value_prompt import ValuePrompt

if TYPE_CHECKING:
    from app.core.session import Session


def untuned_flag_message(name: str) -> str:
    """The refusal of a flag outside the tuning flags, naming it and saying why and what lifts it."""
    return (f"--{name} is not a tuning flag: this dashboard (--tuning-flags-only, how `tunedash serve` opens each "
            "tab) changes only the catalog's tuning flags, never one that names code or files to fetch or run; "
            "`tunedash serve --allow-all-flags` lifts this")


class FlagEditor(Protocol):
    """What the palette's flag commands need of the app that lists them (TunedashApp)."""

    session: Session

    def flag_refusal(self, name: str) -> str | None:
        """Why flag `name` may not be changed here (the toast), or None."""


class FlagCommands(Provider):
    """"--flag-name": set, clear or flip one launch flag in the pending command line."""

    def _editor(self) -> FlagEditor:
        return cast("FlagEditor", self.app)

    def _specs(self) -> list[FlagSpec]:
        """The catalog minus the flags the installed server rejects (its --help, app.core.flags.discovery) and
        those this dashboard may not change."""
        editor = self._editor()
        session = editor.session
        accepted = session.server_flags.flags if session.server_flags is not None else None
        specs = offered_catalog(session.profile.backend, accepted).values()
        return [spec for spec in specs if editor.flag_refusal(spec.name) is None]

    def _label(self, spec: FlagSpec) -> str:
        value = get_flag(self._editor().session.pending_flags, spec.name)
        shown = "unset" if value is None else format_value(value)
        return f"--{spec.name} = {shown}"

    async def discover(self) -> Hits:
        for spec in self._specs()[:12]:
            yield DiscoveryHit(self._label(spec), partial(self._choose, spec), help=spec.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for spec in self._specs():
            label = self._label(spec)
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(self._choose, spec), help=spec.help)

    def _choose(self, spec: FlagSpec) -> None:
        app, session = self.app, self._editor().session
        refused = self._editor().flag_refusal(spec.name)  # the dashboard may have changed since it was listed
        if refused:
            app.notify(refused, severity="warning")
            return
        current = get_flag(session.pending_flags, spec.name)
        if spec.kind == "bool":
            session.set_pending_flag(spec.name, None if current is True else True)
            app.notify(f"pending: {session.describe_pending()}", timeout=2)
            return
        initial = "" if current is None else format_value(current)  # control characters written out

        def answered(text: str | None) -> None:
            if text is None or text == initial:  # unchanged: keep the value (what was shown may be its escaped form)
                return
            if text.strip() == "":
                session.set_pending_flag(spec.name, None)
            else:
                try:
                    session.set_pending_flag(spec.name, parse_value(spec, text.strip()))
                except FlagError as exc:
                    app.notify(f"--{spec.name}: {exc}", severity="error")
                    return
            app.notify(f"pending: {session.describe_pending()}", timeout=2)

        app.push_screen(ValuePrompt(spec.name, spec.help, initial, spec.choices), answered)
