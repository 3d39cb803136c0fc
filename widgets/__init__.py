"""Presentational Textual widgets for tunedash: they take plain data and post messages up.

The data is core's own types from app.core.data (Holder, RelaunchMarker, FlagChange, GpuSnapshot, ...), imported
from there, or a widget's `...View`/row type built by app.tui; nothing else of app.core (pyproject's contracts)."""

from widgets.confirm_modal import ConfirmModal
from widgets.diff_screen import DiffScreen, argv_to_flags, diff_flags
from widgets.error_modal import ErrorModal
from widgets.event_log import EventEntry, EventLog
from widgets.flags_panel import FlagsPanel, ToggleRow
from widgets.gpu_panel import GpuPanel, GpuRow, MemoryBar
from widgets.help_screen import HelpScreen
from widgets.key_footer import KeyFooter
from widgets.log_view_screen import LogLines, LogViewScreen
from widgets.server_panel import ServerPanel, ServerView
from widgets.throughput_chart import ThroughputChart

__all__ = [
    "ConfirmModal",
    "DiffScreen",
    "ErrorModal",
    "EventEntry",
    "EventLog",
    "FlagsPanel",
    "GpuPanel",
    "GpuRow",
    "HelpScreen",
    "KeyFooter",
    "LogLines",
    "LogViewScreen",
    "MemoryBar",
    "ServerPanel",
    "ServerView",
    "ThroughputChart",
    "ToggleRow",
    "argv_to_flags",
    "diff_flags",
]
