"""The Textual app: thin. It holds the dashboard screen, the key map and the theme, and ends the Session.

`create_app(profile, ...)` is the one factory the CLI and the tests use. The dashboard itself (its widgets, keys and
the way core events reach it) is app/tui/dashboard.py's DashboardScreen, the app's default screen, as posting's
MainScreen is; the screens it opens own their keys while they are open. Quitting never touches the server.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import ClassVar

import platformdirs
from textual.actions import parse as parse_action
from textual.app import App, SystemCommand
from textual.binding import BindingType
from textual.screen import Screen

from app.core.hosts.base import Host
from app.core.profiles.types import Profile
from app.core.session import Session
from app.tui.commands import FlagCommands
from app.tui.dashboard import DashboardCommand, DashboardScreen
from app.tui.sigterm import exit_on_sigterm

KEYMAP_FILE = Path(platformdirs.user_config_dir("tunedash")) / "keys.toml"
THEME_FILE = Path(platformdirs.user_config_dir("tunedash")) / "theme.toml"
"""The theme chosen in the palette (Textual's "Theme" command), kept for the next start: `theme = "nord"`."""


class TunedashApp(App[None]):
    """The dashboard app for one profile's server: its default screen is the DashboardScreen."""

    CSS_PATH = "dashboard.tcss"
    TITLE = "tunedash"
    COMMANDS = App.COMMANDS | {FlagCommands}
    VERTICAL_BREAKPOINTS = [(0, "-compact"), (32, "-roomy")]  # noqa: RUF012 - Textual declares it an instance variable
    """Under 32 rows the screen gets class -compact (dashboard.tcss gives the chart more room); Textual
    re-applies it on every resize, including a tmux client of another size attaching."""

    BINDINGS: ClassVar[list[BindingType]] = list(DashboardScreen.APP_BINDINGS)

    def __init__(self, session: Session, *, keymap_file: Path | None = KEYMAP_FILE, fleet: bool = False,
                 theme_file: Path | None = None, tuning_flags_only: bool = False) -> None:
        super().__init__()
        self.theme_file = theme_file  # None: the default theme, and a theme chosen is not kept
        self.back_to_fleet = False  # set when Escape ended the app, so the fleet shows again
        self.session = session
        self.keymap_file = keymap_file
        self.keymap: dict[str, str] = {}  # keys.toml, shared with the dashboard (its refusals name the keys)
        self.dashboard = DashboardScreen(session, keymap=self.keymap, tuning_flags_only=tuning_flags_only,
                                         back_to_fleet=self.action_back_to_fleet if fleet else None)
        self._forget_sigterm = lambda: None  # on_mount: SIGTERM quits as `q` does (the driver lock given back)

    def get_default_screen(self) -> DashboardScreen:
        return self.dashboard

    def on_mount(self) -> None:
        self._forget_sigterm = exit_on_sigterm(self)
        profile = self.session.profile
        self.title = f"tunedash · {profile.name} on {profile.host}"
        self.sub_title = "READ-ONLY" if self.session.readonly else profile.backend
        self._load_keymap()
        self._load_theme()
        self.run_worker(self.session.start(), name="session start", exit_on_error=False)

    # ---- what the dashboard answers (the palette's flag commands and the tests ask the app) --------------
    @property
    def fleet(self) -> bool:
        return self.dashboard.fleet

    @property
    def tuning_flags_only(self) -> bool:
        return self.dashboard.tuning_flags_only

    @property
    def baseline(self) -> Profile | None:
        return self.dashboard.baseline

    @property
    def watching_only(self) -> bool:
        return self.dashboard.watching_only

    def refusal(self, action: str, parameters: tuple[object, ...] = ()) -> str | None:
        """Why the dashboard refuses `action` now, or None (DashboardScreen.refusal)."""
        return self.dashboard.refusal(action, parameters)

    def flag_refusal(self, name: str) -> str | None:
        """Why the palette may not change flag `name` here, or None (FlagEditor, app/tui/commands.py)."""
        return self.dashboard.flag_refusal(name)

    def dashboard_commands(self) -> Iterator[DashboardCommand]:
        return self.dashboard.dashboard_commands()

    def refresh_view(self) -> None:
        """Push the Session's newest state to the dashboard's widgets now."""
        self.dashboard.refresh_view()

    def _load_theme(self) -> None:
        """The theme kept from the last start (THEME_FILE), then keep each one chosen in the palette."""
        if self.theme_file is None:
            return
        try:
            if self.theme_file.exists():
                name = tomllib.loads(self.theme_file.read_text()).get("theme")
                if not isinstance(name, str) or name not in self.available_themes:
                    raise ValueError(f"unknown theme {name!r}; ctrl+p, Theme lists them (choosing one rewrites "
                                     "this file)")
                self.theme = name
        except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
            self.notify(f"{self.theme_file}: {exc}", title="theme ignored", severity="warning")
        self.theme_changed_signal.subscribe(self, self._save_theme)

    def _save_theme(self, theme: object) -> None:
        name = getattr(theme, "name", None)
        if self.theme_file is None or not isinstance(name, str):
            return
        if self.watching_only:
            self.notify(f"{name} for this dashboard only: a read-only dashboard does not write {self.theme_file}",
                        title="theme not kept", timeout=4)
            return
        try:
            self.theme_file.parent.mkdir(parents=True, exist_ok=True)
            self.theme_file.write_text(f'theme = "{name}"  # written by tunedash when a theme is chosen\n')
        except OSError as exc:
            self.notify(f"{self.theme_file}: {exc}", title="theme not kept", severity="warning")

    def _load_keymap(self) -> None:
        """Remap keys from keys.toml: `[keys]` with binding id = key, e.g. relaunch = "R"."""
        if self.keymap_file is None or not self.keymap_file.exists():
            return
        try:
            data = tomllib.loads(self.keymap_file.read_text())
            keys = data.get("keys", {})
            if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
                raise ValueError("[keys] must map binding ids to key names")
            self.keymap.clear()
            self.keymap.update({str(k): str(v) for k, v in keys.items()})
            self.set_keymap(self.keymap)
        except (OSError, ValueError) as exc:
            self.notify(f"{self.keymap_file}: {exc}", title="key map ignored", severity="warning")

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """Every dashboard command is also in the command palette (ctrl+p), after Textual's own; those refused now
        (check_action) are left out, and so is Textual's Screenshot while watching (it writes a file)."""
        for system in super().get_system_commands(screen):
            if not (self.watching_only and system.title == "Screenshot"):
                yield system
        if screen is not self.dashboard:
            return  # a screen over the dashboard (an A/B, the history) owns the keys while it is open
        app_actions = {binding.action for binding in DashboardScreen.APP_BINDINGS}
        for command in self.dashboard_commands():
            _, action, parameters = parse_action(command.action)
            if self.refusal(action, parameters):
                continue
            target = self if command.action in app_actions else self.dashboard
            # "· key r", not "[r]": the palette reads square brackets as markup ([r] is a reverse style)
            yield SystemCommand(f"{command.title} · key {command.key}", command.help,
                                partial(target.run_action, command.action))

    async def on_unmount(self) -> None:
        """However the app ends (q, or a browser tab closed under `tunedash serve`): give the driver lock back and
        stop the Session's streams; the server keeps running."""
        self._forget_sigterm()
        await self.session.stop()

    def action_back_to_fleet(self) -> None:
        """Escape in a dashboard opened from the fleet: end it (on_unmount stops the Session; the fleet's host
        stays open) and let the fleet show again."""
        self.back_to_fleet = True
        self.exit()

    async def action_quit(self) -> None:
        await self.session.stop()
        await self.session.host.close()  # an SSH connection; nothing for the local host
        self.exit()


def create_app(
    profile: Profile,
    *,
    readonly: bool = False,
    probe: bool = False,
    autolaunch: bool = False,
    take_over: bool = False,
    watching: bool = False,
    host: Host | None = None,
    session: Session | None = None,
    keymap_file: Path | None = KEYMAP_FILE,
    fleet: bool = False,
    theme_file: Path | None = THEME_FILE,
    tuning_flags_only: bool = False,
    gpu_source: str = "auto",
) -> TunedashApp:
    """The one factory for the dashboard (CLI and tests); `fleet`: opened from the fleet (Escape goes back);
    `tuning_flags_only`: flags are changed only among the catalog's tuning flags (each `tunedash serve` tab)."""
    if session is None:
        if host is None:
            from app.connect import host_for

            host = host_for(profile)
        session = Session(host, profile, readonly=readonly, probe=probe, autolaunch=autolaunch, take_over=take_over,
                          watching=watching, gpu_source=gpu_source)
    app = TunedashApp(session, keymap_file=keymap_file, fleet=fleet, theme_file=theme_file,
                      tuning_flags_only=tuning_flags_only)
    from app.tui.trust import install_trust_prompt  # an unknown SSH host key: ask in a ConfirmModal

    install_trust_prompt(app, session.host, asks=lambda: not app.watching_only)
    return app
