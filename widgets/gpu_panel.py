"""Provides GpuPanel: one row per GPU with memory bar, utilization, temperature, power and processes.

Unavailable values render as "n/a" with the reason as the cell's tooltip, never as 0. A sample older than
two sample periods is marked stale with its age. Rows are keyed by GPU uuid and only cells whose text
changed are touched, so 8 GPUs at 4 Hz cost little. The owner sets `snapshot` (a reactive: the newest sample,
frozen) as samples arrive; the panel shows it at most every `min_interval_s` and re-marks stale rows on its own
timer, so nobody outside it diffs or ticks. One row can be selected (class "-selected", highlighted):
a click posts Selected and the owner calls select(uuid).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.events import Click
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from app.core.data import GpuSample, GpuSnapshot, TelemetryError

NA = "n/a"
"""What a value that could not be read shows as."""
NAME_MIN_W = 16
"""The name column is as wide as the longest "index name" of the panel plus a space, at least this..."""
BAR_MIN_W = 6
AGE_W = 12
"""...and at most what leaves the memory bar BAR_MIN_W cells (its CSS min-width) beside a "stale 4.2s" age of
AGE_W cells; a longer name is cut with an ellipsis (its tooltip has it whole)."""
FIGURES_W = 19 + 5 + 6 + 6
"""The fixed cells right of the bar (memory, util, temp, power: GpuRow's CSS widths)."""


@dataclass(frozen=True)
class CellText:
    """The text of one cell and its tooltip (None: no tooltip)."""

    text: str
    tooltip: str | None = None


def _reason(sample: GpuSample, *fields: str) -> str:
    """The reason(s) the named fields could not be read, or a generic one."""
    reasons = [f"{name}: {sample.unavailable[name]}" for name in fields if name in sample.unavailable]
    return "; ".join(reasons) if reasons else "not reported by the driver"


def format_age(seconds: float) -> str:
    """A short age: "4.2s", "3m05s", "2h04m"."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def gpu_cells(sample: GpuSample) -> dict[str, CellText]:
    """The text of every cell of one GPU row (pure; tested directly)."""
    cells: dict[str, CellText] = {}
    name = sample.name if sample.name is not None else NA
    name_tip = sample.name if sample.name is not None else _reason(sample, "name")
    cells["name"] = CellText(f"{sample.index} {name}", f"GPU {sample.index} {name_tip}\n{sample.uuid}")

    used, total = sample.memory_used_mib, sample.memory_total_mib
    used_text = str(used) if used is not None else NA
    total_text = str(total) if total is not None else NA
    mem_tip = None
    if used is None or total is None:
        mem_tip = _reason(sample, "memory_used_mib", "memory_total_mib")
    cells["memory"] = CellText(f"{used_text}/{total_text} MiB", mem_tip)

    if sample.utilization_pct is None:
        cells["util"] = CellText(NA, _reason(sample, "utilization_pct"))
    else:
        cells["util"] = CellText(f"{sample.utilization_pct}%", "GPU utilization")
    if sample.temperature_c is None:
        cells["temp"] = CellText(NA, _reason(sample, "temperature_c"))
    else:
        cells["temp"] = CellText(f"{sample.temperature_c}°C", "temperature")
    if sample.power_w is None:
        cells["power"] = CellText(NA, _reason(sample, "power_w"))
    else:
        cells["power"] = CellText(f"{sample.power_w:.0f}W", f"power draw {sample.power_w:.1f} W")

    if sample.processes is None:
        cells["procs"] = CellText(f"processes: {NA}", _reason(sample, "processes"))
    elif not sample.processes:
        cells["procs"] = CellText("no processes", None)
    else:
        parts: list[str] = []
        tips: list[str] = []
        for proc in sample.processes:
            mib = f"{proc.used_mib} MiB" if proc.used_mib is not None else f"{NA} MiB"
            parts.append(f"{proc.pid} {proc.name} {mib}")
            if proc.used_mib is None:
                tips.append(f"{proc.pid}: memory {_reason(sample, 'process_used_mib')}")
        cells["procs"] = CellText("  ".join(parts), "\n".join(tips) or None)
    return cells


class MemoryBar(Widget):
    """A one-line bar of used/total memory. `fraction` None draws an "n/a" bar, never an empty one."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"memory-bar--used", "memory-bar--free", "memory-bar--high"}

    DEFAULT_CSS = """
    MemoryBar {
        height: 1;
        width: 1fr;
        min-width: 6;
        & > .memory-bar--used { color: $primary; }
        & > .memory-bar--high { color: $warning; }
        & > .memory-bar--free { color: $text-muted; }
    }
    """

    fraction: reactive[float | None] = reactive(None)
    """Used / total in [0, 1], or None when either value is unavailable."""

    def render(self) -> Text:
        """Draw the bar at the widget's width."""
        width = max(1, self.size.width)
        if self.fraction is None:
            label = f" {NA} "
            pad = max(0, width - len(label))
            left = pad // 2
            return Text(
                "·" * left + label + "·" * (pad - left), self.get_component_rich_style("memory-bar--free", partial=True)
            )
        fraction = min(1.0, max(0.0, self.fraction))
        filled = round(fraction * width)
        if fraction > 0 and filled == 0:
            filled = 1
        used_style = "memory-bar--high" if fraction >= 0.9 else "memory-bar--used"
        text = Text()
        text.append("█" * filled, self.get_component_rich_style(used_style, partial=True))
        text.append("░" * (width - filled), self.get_component_rich_style("memory-bar--free", partial=True))
        return text


class GpuRow(Widget):
    """One GPU: a line of figures and a line of processes. Created and updated by GpuPanel."""

    DEFAULT_CSS = """
    GpuRow {
        height: auto;
        & > Horizontal { height: 1; }
        .gpu-name { width: 16; text-wrap: nowrap; text-overflow: ellipsis; text-style: bold; }
        .gpu-memory { width: 19; text-align: right; }
        .gpu-util { width: 5; text-align: right; }
        .gpu-temp { width: 6; text-align: right; }
        .gpu-power { width: 6; text-align: right; }
        .gpu-age { width: 12; text-align: right; color: $text-muted; }
        .gpu-procs { height: 1; padding-left: 2; color: $text-muted; text-wrap: nowrap; text-overflow: ellipsis; }
        .-na { color: $text-muted; text-style: italic; }
        &.-stale { color: $text-muted; }
        &.-stale .gpu-age { color: $warning; text-style: bold; }
        &:hover { background: $boost; }
        &.-selected { background: $accent 20%; }
    }
    """

    _CELLS = ("name", "memory", "util", "temp", "power")

    def __init__(self, sample: GpuSample) -> None:
        super().__init__(classes="gpu-row")
        self.uuid = sample.uuid
        self.index = sample.index
        self.taken_at = sample.taken_at
        self._shown: dict[str, CellText] = {}
        self._shown_age_text = ""
        self._sample = sample
        self._composed = False
        self._cells_ready = False  # set once the cells are found mounted (a query per show cost more than the show)
        self._age_args: tuple[float, float] | None = None
        self._statics: dict[str, Static] = {}  # the cells by key, made in compose (no query per update)
        self._bar: MemoryBar | None = None
        self._name_width = NAME_MIN_W

    def compose(self) -> ComposeResult:
        """A line of cells and a line of processes."""
        self._statics = {key: Static(classes=f"gpu-{key}", markup=False)
                         for key in ("name", "memory", "util", "temp", "power", "age", "procs")}
        self._bar = MemoryBar()
        with Horizontal():
            yield self._statics["name"]
            yield self._bar
            for key in ("memory", "util", "temp", "power", "age"):
                yield self._statics[key]
        yield self._statics["procs"]

    def _cells_mounted(self) -> bool:
        """The cells live in a Horizontal whose children can mount after this row's Mount event (a show
        then failed with NoMatches on MemoryBar); until they are there, show again after the next refresh."""
        if self._cells_ready:
            return True
        if self.query(MemoryBar):
            self._cells_ready = True
            return True
        self.call_after_refresh(lambda: self.show(self._sample))
        return False

    def show(self, sample: GpuSample) -> None:
        """Show a new sample, touching only the cells whose text changed."""
        self._sample = sample
        self.taken_at = sample.taken_at
        self.index = sample.index
        if not self._composed or not self._cells_mounted():
            return
        for key, cell in gpu_cells(sample).items():
            if self._shown.get(key) == cell:
                continue
            self._shown[key] = cell
            static = self._statics[key]
            static.update(cell.text, layout=False)  # fixed-size one-line cells: no layout pass
            static.tooltip = cell.tooltip
            static.set_class(cell.text == NA or cell.text.endswith(f": {NA}"), "-na")
        used, total = sample.memory_used_mib, sample.memory_total_mib
        fraction = used / total if used is not None and total else None
        bar = self._bar
        assert bar is not None  # made in compose, which ran (_composed)
        bar.fraction = fraction
        tooltip = None if fraction is not None else self._shown["memory"].tooltip
        if bar.tooltip != tooltip:
            bar.tooltip = tooltip

    def set_age(self, now: float, stale_after_s: float) -> None:
        """Mark the row stale when its sample is older than `stale_after_s` at `now`."""
        self._age_args = (now, stale_after_s)
        age = now - self.taken_at
        stale = age > stale_after_s
        if self.has_class("-stale") != stale:
            self.set_class(stale, "-stale")
        cell = CellText(f"stale {format_age(age)}" if stale else "", "no new sample" if stale else None)
        if self._shown.get("age") != cell and self._composed and self._cells_mounted():
            self._shown["age"] = cell
            static = self._statics["age"]
            # The age cell is as wide as its text: lay out again only when it appears or goes.
            static.update(cell.text, layout=(not self._shown_age_text) != (not cell.text))
            self._shown_age_text = cell.text
            static.tooltip = cell.tooltip

    @property
    def name_text(self) -> str:
        """The name cell's text ("0 NVIDIA RTX A6000")."""
        name = self._sample.name if self._sample.name is not None else NA
        return f"{self._sample.index} {name}"

    def set_name_width(self, width: int) -> None:
        """Make the name column `width` cells wide (the panel gives every row the same width)."""
        self._name_width = width
        static = self._statics.get("name")
        if static is not None and static.styles.width != width:
            static.styles.width = width

    def on_mount(self) -> None:
        """Show the sample the row was created with."""
        self._composed = True
        self.show(self._sample)
        if self._age_args is not None:
            self.set_age(*self._age_args)
        self.set_name_width(self._name_width)

    def on_click(self, event: Click) -> None:
        """Tell the panel this GPU was selected."""
        self.post_message(GpuPanel.Selected(self.index, self.uuid))


class GpuPanel(Widget):
    """All GPUs of a host, one GpuRow each, keyed by uuid.

    Set `snapshot` as samples arrive (or call `update(snapshot_or_samples, now, period_s)` to show one at once).
    `now` must be on the same clock as `GpuSample.taken_at` (the client's time.monotonic()); a row whose sample is
    older than 2 * `period_s` shows "stale <age>". A snapshot carrying a TelemetryError keeps the last rows (which
    then go stale) and shows the error with its hint above them.
    """

    snapshot: reactive[GpuSnapshot | None] = reactive(None, layout=False, repaint=False, init=False,
                                                      always_update=True)
    """The newest sample (frozen). Shown at the panel's next tick (its own timer every `min_interval_s`, or the
    owner's `tick()` with `own_timer=False`), not at once: a 4 Hz sampler then costs a redraw at most once a tick,
    and an owner that ticks its other widgets too gets one screen update for all of them instead of one each
    (measured: docs/decisions.md#typed-results-and-widgets-that-follow-events); only while the panel's screen is the
    top one (dolphie: no UI updates while hidden or under a modal)."""

    DEFAULT_CSS = """
    GpuPanel {
        height: auto;
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        padding: 0 1;
        & > .gpu-error { display: none; color: $error; height: auto; }
        &.-error > .gpu-error { display: block; }
        & > .gpu-empty { color: $text-muted; height: 1; }
    }
    """

    class Selected(Message):
        """The user clicked a GPU row."""

        def __init__(self, index: int, uuid: str) -> None:
            super().__init__()
            self.index = index
            self.uuid = uuid

    def __init__(self, *, min_interval_s: float = 0.5, period_s: float = 1.0, own_timer: bool = True,
                 name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.min_interval_s = min_interval_s
        self.own_timer = own_timer  # False: the owner calls tick() from its own clock
        self.period_s = period_s  # the sampler's period: a row is stale after two
        self._shown: GpuSnapshot | None = None  # the snapshot last shown
        self.border_title = "GPUs"
        self._rows: dict[str, GpuRow] = {}
        self._error: TelemetryError | None = None
        self._selected: str | None = None
        self._names: tuple[str | None, ...] = ()

    def on_mount(self) -> None:
        if self.own_timer:
            self.set_interval(self.min_interval_s, self.tick)

    def tick(self) -> None:
        """The panel's clock (its timer, or the owner's): the newest snapshot when one waits, else the rows' ages."""
        if self.snapshot is None or not self._in_front:
            return  # an owner that calls update() itself keeps the clock (a fixed one in tests)
        if self.snapshot is not None and self.snapshot is not self._shown:
            self._show_newest()
        else:
            self.set_ages(time.monotonic(), self.period_s)

    def _show_newest(self) -> None:
        snapshot = self.snapshot
        if snapshot is None or snapshot is self._shown or not self.is_mounted or not self._in_front:
            return
        self.update(snapshot, time.monotonic(), self.period_s)

    @property
    def _in_front(self) -> bool:
        """The panel's screen is the top one (not under another screen, a modal included; Screen.is_current also
        counts the screen right under the top one)."""
        return self.app.screen is self.screen

    def compose(self) -> ComposeResult:
        """The error line and a placeholder until the first sample."""
        yield Static(classes="gpu-error", markup=False)
        yield Static("waiting for the first sample…", classes="gpu-empty")

    def show_placeholder(self, text: str) -> None:
        """What the panel says while it has no rows ("no GPUs in this profile" instead of waiting for a sample)."""
        for static in self.query(".gpu-empty").results(Static):
            static.update(text)

    @property
    def rows(self) -> dict[str, GpuRow]:
        """The mounted rows by GPU uuid."""
        return dict(self._rows)

    @property
    def selected(self) -> str | None:
        """The uuid of the selected GPU, or None."""
        return self._selected

    def select(self, uuid: str | None) -> None:
        """Highlight the row of GPU `uuid` (None, or a GPU not shown: no row is selected)."""
        self._selected = uuid if uuid in self._rows else None
        for row_uuid, row in self._rows.items():
            row.set_class(row_uuid == self._selected, "-selected")

    def update(self, data: GpuSnapshot | Sequence[GpuSample], now: float, period_s: float | None = None) -> None:
        """Show the newest samples; rows are added/removed only when the set of GPUs changes. `period_s` (when
        given) becomes the panel's sample period."""
        if period_s is not None:
            self.period_s = period_s
        if isinstance(data, GpuSnapshot):
            self._shown = data
            self._set_error(data.error)
            samples: Sequence[GpuSample] = data.gpus
        else:
            self._set_error(None)
            samples = data
        if samples:
            uuids = [s.uuid for s in sorted(samples, key=lambda s: s.index)]
            if uuids != list(self._rows):
                self._remount(sorted(samples, key=lambda s: s.index))
            else:
                for sample in samples:
                    self._rows[sample.uuid].show(sample)
                names = tuple(s.name for s in samples)
                if names != self._names:  # a name read late (n/a first): the column follows
                    self._names = names
                    self._fit_names()
        self.set_ages(now, self.period_s)

    def set_ages(self, now: float, period_s: float | None = None) -> None:
        """Only re-mark stale rows (the panel's own timer does, once it is fed through `snapshot`)."""
        limit = 2 * (self.period_s if period_s is None else period_s)
        for row in self._rows.values():
            row.set_age(now, limit)

    def _remount(self, samples: Sequence[GpuSample]) -> None:
        """Replace all rows (only when GPUs appear or disappear)."""
        for row in self._rows.values():
            row.remove()
        self._rows = {s.uuid: GpuRow(s) for s in samples}
        self._names = tuple(s.name for s in samples)
        empty = self.query(".gpu-empty")
        if empty:
            empty.remove()
        self.mount_all(list(self._rows.values()))
        self.select(self._selected)  # the selected GPU stays selected while it is shown
        self._fit_names()

    def _fit_names(self) -> None:
        """Give the name column the room the names need ("0 NVIDIA RTX A6000", not "0 NVIDIA RTX A6…") while the
        memory bar keeps BAR_MIN_W cells even beside a stale age; every row gets the same width, so the bars line
        up."""
        if not self._rows:
            return
        longest = max(len(row.name_text) for row in self._rows.values()) + 1  # and a space before the bar
        room = self.content_size.width - FIGURES_W - AGE_W - BAR_MIN_W if self.content_size.width else longest
        width = max(NAME_MIN_W, min(longest, room))
        for row in self._rows.values():
            row.set_name_width(width)

    def on_resize(self) -> None:
        """The names may get more (or less) room."""
        self._fit_names()

    def _set_error(self, error: TelemetryError | None) -> None:
        if error == self._error:
            return
        self._error = error
        self.set_class(error is not None, "-error")
        if error is not None:
            text = f"telemetry failed ({error.kind}): {error.message}"
            if error.exit_code is not None:
                text += f" [exit {error.exit_code}]"
            if error.hint:
                text += f"\n{error.hint}"
            self.query_one(".gpu-error", Static).update(text)
