"""The tests never read the developer's own config (issue 25, item 6): tests/conftest.py points every XDG folder
into a scratch folder before the dashboard reads its theme.toml and keys.toml, so a developer's remapped keys or
theme cannot change what a UI test sees, and no test writes into their history or state."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from app.core.measure.store import default_path
from app.core.profiles.loading import profile_dirs
from app.tui.app import KEYMAP_FILE, THEME_FILE


def _inside(path: Path, variable: str) -> bool:
    return path.is_relative_to(Path(os.environ[variable]))


def test_the_dashboards_config_files_are_the_sessions_not_the_developers() -> None:
    own = Path.home() / ".config"
    for path in (KEYMAP_FILE, THEME_FILE, profile_dirs()[0]):
        assert _inside(path, "XDG_CONFIG_HOME") and not path.is_relative_to(own), path


def test_history_and_state_are_the_sessions_too() -> None:
    assert not default_path().is_relative_to(Path.home() / ".local")
    assert _inside(Path(platformdirs.user_state_dir("tunedash")), "XDG_STATE_HOME")
