"""Presentational Textual widgets for tunedash: they take plain data and post messages up."""

from widgets.confirm_modal import ConfirmModal
from widgets.diff_screen import DiffScreen, FlagChange, argv_to_flags, diff_flags
from widgets.error_modal import ErrorModal
from widgets.event_log import EventEntry, EventLog
from widgets.flags_panel import FlagsPanel, ToggleRow
from widgets.gpu_panel import GpuPanel, GpuRow, MemoryBar
from widgets.help_screen import HelpScreen
from widgets.log_view_screen import LogLines, LogViewScreen
from widgets.server_panel import Holder, ServerPanel, ServerView
from widgets.throughput_chart import RelaunchMarker, ThroughputChart

__all__ = [
    "ConfirmModal",
    "DiffScreen",
    "ErrorModal",
    "EventEntry",
    "EventLog",
    "FlagChange",
    "FlagsPanel",
    "GpuPanel",
    "GpuRow",
    "HelpScreen",
    "Holder",
    "LogLines",
    "LogViewScreen",
    "MemoryBar",
    "RelaunchMarker",
    "ServerPanel",
    "ServerView",
    "ThroughputChart",
    "ToggleRow",
    "argv_to_flags",
    "diff_flags",
]
