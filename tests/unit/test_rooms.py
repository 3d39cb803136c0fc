"""The rooms of docs/architecture.md: the core imports no UI and no simulator; widgets import no hosts or NVML."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import app.core
from tests.helpers import REPO


def _loaded_after_import(modules: list[str], forbidden: tuple[str, ...]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r}"
        " or m.startswith(('app.sim', 'app.tui')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return list(json.loads(out.stdout))


def test_every_core_module_imports_no_ui_and_no_simulator() -> None:
    modules = [m.name for m in pkgutil.walk_packages(app.core.__path__, "app.core.") if not m.ispkg]
    assert len(modules) > 25
    assert _loaded_after_import(modules, ("textual", "rich", "widgets")) == []


def test_widgets_import_no_hosts_no_nvml_no_ssh() -> None:
    code = (
        "import sys, widgets\n"
        "print([m for m in sys.modules if m.split('.')[0] in ('asyncssh', 'pynvml') "
        "or m.startswith(('app.core.hosts', 'app.sim'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_core_telemetry_imports_no_ui() -> None:
    """Importing the telemetry modules loads no UI and not NVML (pynvml is loaded only when NVML is used)."""
    code = (
        "import sys, app.core.telemetry.smi, app.core.telemetry.smi_parse, app.core.telemetry.nvml;"
        "bad = [m for m in ('textual', 'rich', 'widgets', 'pynvml') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_server_room_imports_nothing_of_measure() -> None:
    """app.core.server is below app.core.measure (docs/architecture.md#the-rooms): loading every server module
    loads no measure module (the lifecycle's health check came from measure.http_probes)."""
    modules = [m.name for m in pkgutil.walk_packages([str(REPO / "app/core/server")], "app.core.server.")]
    assert "app.core.server.lifecycle" in modules
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('app.core.measure'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert json.loads(out.stdout) == []
