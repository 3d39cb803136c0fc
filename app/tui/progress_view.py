"""The Server panel's progress block from the core's LaunchProgress (app.core.server.progress): whole seconds, so
the panel redraws once a second while a launch runs, and never when none does."""

from __future__ import annotations

import math

from app.core.server.progress import LaunchProgress
from widgets.server_panel import ProgressView


def progress_view(progress: LaunchProgress | None) -> ProgressView | None:
    if progress is None or progress.done:
        return None
    return ProgressView(
        kind=progress.kind,
        phase=progress.phase,
        elapsed_s=int(progress.elapsed_s),
        fraction=None if progress.fraction is None else round(progress.fraction, 2),
        eta_s=None if progress.eta_s is None else math.ceil(progress.eta_s),
        over_s=int(progress.over_s),
        basis=progress.basis,
        phases=progress.phases,
    )
