"""The command slot on its own (app/core/command.py): one command at a time, a refusal that names what runs, a kill
that cancels it first, a hook that may refuse, watchers kept apart from each other's failures."""

from __future__ import annotations

import asyncio

from app.core.command import CommandRefused, CommandSlot, CommandView
from app.core.data import EventLevel


class Notes(list[tuple[str, str]]):
    def __call__(self, text: str, level: EventLevel) -> None:
        self.append((text, level))


async def test_a_second_command_is_refused_naming_the_first_and_a_kill_cancels_it() -> None:
    notes = Notes()
    slot = CommandSlot(notes)
    ab_ended: list[str] = []

    async def ab() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            ab_ended.append("cancelled")
            raise

    assert slot.start("A/B", ab) is not None
    await asyncio.sleep(0)
    slot.progress("arm A launch 1/2")
    assert slot.start("relaunch", ab) is None  # refused: nothing started
    assert slot.refusal("relaunch") == "relaunch refused: the A/B (arm A launch 1/2) is in progress"
    killed: list[str] = []

    async def kill() -> None:
        killed.append("after" if ab_ended else "before the A/B ended")

    task = slot.start("kill", kill)
    assert task is not None
    await task
    assert ab_ended == ["cancelled"] and killed == ["after"]
    assert ("kill: cancelling the A/B (arm A launch 1/2) in progress", "warning") in notes
    assert slot.current is None and not slot.running


async def test_the_hook_before_a_command_may_refuse_it_and_the_event_log_says_so() -> None:
    notes = Notes()
    slot = CommandSlot(notes)
    ran: list[str] = []

    async def ask(name: str) -> None:
        raise CommandRefused(f"{name}: not confirmed, nothing was signalled")

    async def kill() -> None:
        ran.append("kill")

    task = slot.start("kill", kill, before=ask)
    assert task is not None
    await task
    assert ran == [] and notes == [("kill: not confirmed, nothing was signalled", "error")]


async def test_a_failing_watcher_stops_neither_the_others_nor_the_command() -> None:
    slot = CommandSlot(Notes())
    seen: list[CommandView | None] = []

    def broken(_view: CommandView | None) -> None:
        raise RuntimeError("a widget that is gone")

    slot.watch(broken)
    unwatch = slot.watch(seen.append)

    async def bench() -> None:
        slot.progress("measuring")

    task = slot.start("bench", bench)
    assert task is not None
    await task
    assert [v.name if v else None for v in seen] == ["bench", "bench", None]
    assert seen[1] is not None and seen[1].progress == "measuring"
    unwatch()
    task = slot.start("bench", bench)
    assert task is not None
    await task
    assert len(seen) == 3  # unwatched: heard nothing more


async def test_closing_waits_for_the_clean_up_of_a_command_that_asked_for_it_and_no_other() -> None:
    slot = CommandSlot(Notes())
    cleaned: list[str] = []

    async def tune_on_slots() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.2)  # killing the other slots' servers
            cleaned.append("slots freed")

    assert slot.start("tune", tune_on_slots, settle_s=5.0) is not None
    await asyncio.sleep(0)
    await slot.close()
    assert cleaned == ["slots freed"] and not slot.running  # quitting waited for it
    assert slot.start("tune", tune_on_slots) is not None
    await asyncio.sleep(0)
    await slot.close()
    assert cleaned == ["slots freed"]  # cancelled; nothing waited for its clean-up
    await asyncio.sleep(0.3)
    assert cleaned == ["slots freed", "slots freed"]
