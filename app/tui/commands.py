"""Command palette: every flag of the backend's catalog can be set, not only the ones with keys."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

from app.core.flags.catalog import FlagSpec
from app.core.flags.discovery import offered_catalog
from app.core.flags.values import FlagError, format_value, get_flag, parse_value
from app.tui.value_prompt import ValuePrompt

if TYPE_CHECKING:
    from app.tui.app import TunedashApp


class FlagCommands(Provider):
    """"--flag-name": set, clear or flip one launch flag in the pending command line."""

    def _app(self) -> TunedashApp:
        return self.app  # type: ignore[return-value]

    def _specs(self) -> list[FlagSpec]:
        """The catalog minus the flags the installed server rejects (its --help, app.core.flags.discovery)."""
        session = self._app().session
        accepted = session.server_flags.flags if session.server_flags is not None else None
        return list(offered_catalog(session.profile.backend, accepted).values())

    def _label(self, spec: FlagSpec) -> str:
        value = get_flag(self._app().session.pending_flags, spec.name)
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
        app = self._app()
        session = app.session
        current = get_flag(session.pending_flags, spec.name)
        if spec.kind == "bool":
            session.set_pending_flag(spec.name, None if current is True else True)
            app.notify(f"pending: {session.describe_pending()}", timeout=2)
            return

        def answered(text: str | None) -> None:
            if text is None:
                return
            if text.strip() == "":
                session.set_pending_flag(spec.name, None)
            else:
                try:
                    session.set_pending_flag(spec.name, parse_value(spec, text.strip()))
                except FlagError as exc:
                    app.notify(str(exc), severity="error")
                    return
            app.notify(f"pending: {session.describe_pending()}", timeout=2)

        initial = "" if current is None else format_value(current)
        app.push_screen(ValuePrompt(spec.name, spec.help, initial, spec.choices), answered)
