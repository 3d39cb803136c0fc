"""Errors the core raises on purpose: TunedashError, their one root, with a title and a message for people and a
Reason for programs.

The core never knows about exit codes: app/cli/common.py is the one place that turns a Reason into one
(docs/architecture.md, "Exit codes"). A message names the file, flag or host and says what to do.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Why a command could not do what it was asked."""

    BAD_INPUT = "bad_input"  # a profile, flag, arm, file or run id that is wrong
    ALREADY_RUNNING = "already_running"  # a launch onto a server of the same profile that runs
    NOT_RUNNING = "not_running"  # a command that needs a running (ready) server found none
    GPUS_UNREADABLE = "gpus_unreadable"  # nvidia-smi / NVML could not be read
    GPUS_HELD = "gpus_held"  # the profile's GPUs hold memory or processes (named in the message)
    PORT_IN_USE = "port_in_use"  # another process listens on the profile's port
    START_FAILED = "start_failed"  # the server crashed or did not become ready
    NO_TOKENS = "no_tokens"  # a measurement finished no request
    DRIVEN_ELSEWHERE = "driven_elsewhere"  # another live session holds the server's driver lock


class TunedashError(Exception):
    """The root of every error the core raises on purpose: a `title` (a few words saying what failed, for a
    dialog's title or a log line's head), the message (it names the file, flag or host and says what to do) and a
    Reason (for programs: app/cli/common.py turns it into an exit code). Each subclass sets its own title and
    default reason; a raise may give others."""

    title: str = "tunedash error"
    default_reason: Reason = Reason.BAD_INPUT

    def __init__(self, message: str, reason: Reason | None = None, *, title: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason if reason is not None else self.default_reason
        if title is not None:
            self.title = title

    def describe(self) -> str:
        """`title: message`, for a log line or a notification."""
        return f"{self.title}: {self.message}"
