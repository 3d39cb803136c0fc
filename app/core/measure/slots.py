"""Parallel slots: disjoint GPU sets of one host, each running its own server (`tune --slots N`, `ab --slots 2`).

A host with more GPUs than the profile uses holds several slots (8 GPUs at TP 2 = 4). A slot is a GPU set, a port
and, through `slot_profile`, a profile of its own: its own name (slot 0 keeps the profile's; slot i is
`NAME@sloti`), so its own job record and driver lock (both are keyed by the profile's name and file:
app.core.server.jobs.record_name), its own log and its own release watch on its own GPUs. Everything the
kill-safety rests on works per slot unchanged.

`plan_slots` is pure: slot 0 is the profile's own GPUs and port; slot i the i-th run of as many GPUs with adjacent
indices (a TP group on neighbours, as a real server's ranks sit) among the host's GPUs that are neither slot 0's
nor busy, on port + i. `busy_gpus` reads which GPUs someone else holds from one telemetry snapshot, with the rule
that confirms a GPU free after a kill (app.core.telemetry.freecheck: a compute process, or memory over the idle
limit with none) and names each holder's owner (jobs.with_owners); a holder tagged by one of our own slots' job
records is ours (the tuner relaunches it) and does not make its GPU busy. GPUs held by anyone else are never used.

On the host (one owner for the CLI's `tune --slots N` and `ab --slots 2` and the dashboard's tune on slots):
`plan_on_host` is that plan from one nvidia-smi snapshot, `slots_that_fit` how many the host holds now (what the
dashboard offers), and `free_slots` the end of a run: every slot's server but slot 0's killed and its GPUs
confirmed free, a line per slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

from app.core.data import GpuSnapshot
from app.core.errors import TunedashError
from app.core.hosts.base import Host
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.freecheck import FreeCheck
from app.core.telemetry.smi import telemetry_for

MAX_PORT = 65535


class SlotError(TunedashError):
    """The slots asked for cannot be placed (names the profile, the GPUs and what to do)."""

    title = "slots: cannot place them"


@dataclass(frozen=True)
class Slot:
    """One GPU set and port of the host."""

    index: int
    gpus: tuple[int, ...]
    port: int

    @property
    def label(self) -> str:
        return f"slot {self.index} (GPUs {','.join(str(g) for g in self.gpus)}, port {self.port})"

    def to_json(self) -> dict[str, Any]:
        """As a launch row stores it (the store's `launches.slot`)."""
        return {"index": self.index, "gpus": list(self.gpus), "port": self.port}

    @classmethod
    def from_json(cls, row: object) -> Slot | None:
        """A stored launch's slot (`to_json`), checked where it enters: None unless the index and port are
        integers >= 0 and the GPUs a list of them."""
        if not isinstance(row, dict):
            return None
        index, gpus, port = row.get("index"), row.get("gpus"), row.get("port")
        if not (_whole(index) and _whole(port) and isinstance(gpus, list) and all(_whole(g) for g in gpus)):
            return None
        return cls(index, tuple(gpus), port)


def _whole(value: object) -> TypeGuard[int]:
    """An integer >= 0 (not a bool), as a stored slot's index, port and GPUs must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def slot_name(profile_name: str, index: int) -> str:
    """The profile name a slot's server runs under: the profile's own for slot 0, `NAME@sloti` for the others."""
    return profile_name if index == 0 else f"{profile_name}@slot{index}"


def slot_profile(profile: Profile, slot: Slot) -> Profile:
    """The profile a slot's server is launched with: its name, GPUs and port; everything else the profile's."""
    return replace(profile, name=slot_name(profile.name, slot.index), gpus=tuple(slot.gpus), port=slot.port)


def plan_slots(profile: Profile, n: int, host_gpus: Sequence[int], busy: Mapping[int, str]) -> list[Slot]:
    """`n` disjoint slots for `profile` on a host with `host_gpus`, none on a GPU in `busy` (gpu -> who holds it).

    Raises SlotError naming what is missing: a profile without GPUs, one that pins CUDA_VISIBLE_DEVICES in [env],
    its own GPUs busy or not on the host, too few free GPUs (how many slots fit, which GPUs are busy and by whom),
    or ports past 65535."""
    where = f"profile {profile.name}"
    if n < 1:
        raise SlotError(f"{where}: --slots must be at least 1 (got {n})")
    width = len(profile.gpus)
    if width == 0:
        raise SlotError(f"{where} names no GPUs (`gpus = [...]`): a slot is a set of GPUs, so --slots needs them")
    if n > 1 and "CUDA_VISIBLE_DEVICES" in profile.env:
        raise SlotError(f"{where} sets CUDA_VISIBLE_DEVICES in [env], which would put every slot on the same GPUs: "
                        "name the GPUs in `gpus = [...]` instead")
    on_host = sorted(set(host_gpus))
    missing = [g for g in profile.gpus if g not in on_host]
    if missing:
        raise SlotError(f"{where}: GPU {', '.join(map(str, missing))} of `gpus` is not on the host "
                        f"(it has {', '.join(map(str, on_host)) or 'none'})")
    held = [g for g in profile.gpus if g in busy]
    if held:
        raise SlotError(f"{where}: its own GPUs are in use by someone else ("
                        + "; ".join(f"GPU{g}: {busy[g]}" for g in held) + "); slot 0 runs there: free them first")
    slots = _place(profile, n, on_host, busy)
    if len(slots) < n:
        busy_text = ("; busy: " + "; ".join(f"GPU{g}: {who}" for g, who in sorted(busy.items()))) if busy else ""
        fix = "free the busy GPUs" if busy else "run it on a host with more GPUs"
        raise SlotError(f"{where}: --slots {n} needs {n} sets of {width} adjacent free GPUs; {len(slots)} fit on this "
                        f"host (GPUs {', '.join(map(str, on_host))}{busy_text}). Ask for --slots {len(slots)} or "
                        f"{fix}")
    if slots[-1].port > MAX_PORT:
        raise SlotError(f"{where}: slot {slots[-1].index} would listen on port {slots[-1].port}, past {MAX_PORT}: "
                        "give the profile a lower `port`")
    return slots


def _place(profile: Profile, n: int, on_host: Sequence[int], busy: Mapping[int, str]) -> list[Slot]:
    """Slot 0 on the profile's GPUs, then up to n - 1 more on runs of adjacent GPUs neither taken nor busy."""
    width = len(profile.gpus)
    slots = [Slot(0, tuple(profile.gpus), profile.port)]
    taken = set(profile.gpus)
    run: list[int] = []
    for g in on_host:
        if len(slots) == n:
            break
        if g in taken or g in busy:
            run = []
            continue
        if run and g != run[-1] + 1:
            run = []
        run.append(g)
        if len(run) == width:
            slots.append(Slot(len(slots), tuple(run), profile.port + len(slots)))
            taken.update(run)
            run = []
    return slots


async def busy_gpus(host: Host, snapshot: GpuSnapshot, ours: Sequence[jobs.JobRecord] = ()) -> dict[int, str]:
    """The host's GPUs that someone else holds, from one snapshot: gpu -> who (the holders, with their owners).

    A holder tagged by one of `ours` (our own slots' job records) does not count. Raises SlotError when the
    snapshot could not be read (the GPUs cannot be shown free, so none may be used)."""
    if snapshot.error is not None:
        raise SlotError(f"{host.name}: the GPUs could not be read ({snapshot.error.message}), so no slot can be shown "
                        "free")
    our_tags = {r.tag for r in ours if r.tag}
    busy: dict[int, str] = {}
    for gpu in snapshot.gpus:
        verdict = FreeCheck((gpu.index,), needed=1).feed(snapshot)
        if verdict.unreadable:
            busy[gpu.index] = f"unreadable ({verdict.unreadable})"
            continue
        if verdict.all_free:
            continue
        named = await jobs.with_owners(host, None, verdict)
        others = [h for h in named.holders
                  if not (h.pid is not None and our_tags and await _tagged_ours(host, h.pid, our_tags))]
        if others:
            busy[gpu.index] = "; ".join(h.describe() for h in others)
    return busy


async def _tagged_ours(host: Host, pid: int, tags: set[str]) -> bool:
    value = await host.environ_value(pid, jobs.TAG_ENV)
    return value is not None and value in tags


async def _host_gpus(host: Host, profile: Profile, n: int | None) -> tuple[list[int], dict[int, str]]:
    """The host's GPUs from one nvidia-smi snapshot and those someone else holds (busy_gpus); the servers of our
    own first `n` slots (by their job records; None: as many as the host's GPUs hold) do not count."""
    telemetry = telemetry_for(host, "smi", None)
    try:
        snapshot = await telemetry.sample()
    finally:
        await telemetry.close()
    if n is None:
        n = len(snapshot.gpus) // max(1, len(profile.gpus))
    ours = [r for r in [await jobs.load_job(host, slot_profile(profile, Slot(i, (), profile.port)))
                        for i in range(n)] if r is not None]
    return [g.index for g in snapshot.gpus], await busy_gpus(host, snapshot, ours)


async def plan_on_host(host: Host, profile: Profile, n: int) -> list[Slot]:
    """The plan of `n` slots on the host now: its GPUs from one nvidia-smi snapshot, none that someone else holds
    (our own slots' servers, by their job records, do not count: the run relaunches them). SlotError when they do
    not fit (plan_slots' text: the profile, the GPUs and who holds them)."""
    if n < 1:  # plan_slots' refusal, without reading the GPUs first
        return plan_slots(profile, n, (), {})
    gpus, busy = await _host_gpus(host, profile, n)
    return plan_slots(profile, n, gpus, busy)


async def slots_that_fit(host: Host, profile: Profile) -> tuple[int, int]:
    """(the host's GPUs, how many slots of the profile's width fit on them now), from one nvidia-smi snapshot;
    0 slots when the profile names no GPUs or its own are busy or missing (plan_on_host then says why).
    SlotError when the GPUs cannot be read."""
    if not profile.gpus:
        return 0, 0
    gpus, busy = await _host_gpus(host, profile, None)
    on_host = sorted(set(gpus))
    if any(g not in on_host or g in busy for g in profile.gpus):
        return len(on_host), 0
    return len(on_host), len(_place(profile, len(on_host), on_host, busy))


async def free_slots(servers: Sequence[tuple[Slot, ServerLifecycle]]) -> list[str]:
    """The end of a run on slots: kill every slot's server but slot 0's (the profile's own, which ends on the
    winner) and confirm its GPUs free, one after the other; a line per slot saying so (or what failed)."""
    lines = []
    for slot, lifecycle in servers:
        if slot.index == 0:
            continue
        gpus = ",".join(map(str, slot.gpus))
        try:
            verdict = await lifecycle.kill(confirm_free=True)
        except TunedashError as exc:
            lines.append(f"{slot.label}: the kill failed: {exc}")
            continue
        if verdict is not None and verdict.all_free:
            lines.append(f"{slot.label}: server killed, GPUs {gpus} confirmed free")
        else:
            lines.append(f"{slot.label}: GPUs {gpus} NOT confirmed free"
                         + (f" ({'; '.join(h.describe() for h in verdict.holders)})" if verdict and verdict.holders
                            else ""))
    return lines
