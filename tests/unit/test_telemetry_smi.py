"""SmiTelemetry over a scripted host: join by uuid, failures as snapshots, -lms ticks, the process-list rule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import pytest

from app.core.data import GpuSnapshot
from app.core.hosts.base import CommandResult, HostError
from app.core.telemetry.smi import SmiTelemetry
from tests.fakes import CommandOnlyHost
from tests.helpers import DATA as TEST_DATA

DATA = TEST_DATA / "smi"
H200 = "GPU-529c853d-7a5b-f0b8-3c1e-2d4b5e6f7a81"
A100 = "GPU-7f3e2a10-1111-2222-3333-444455556666"
TWO_GPUS = (DATA / "two_gpus.csv").read_text()
ROW0 = TWO_GPUS.splitlines()[0]
ROW1 = TWO_GPUS.splitlines()[1]
APPS_BOTH = f"{A100}, 2001, 9104, python -m sglang.launch_server --tp 2\n{H200}, 2002, 518, /usr/bin/python3\n"

Reply = CommandResult | Exception | Callable[[], "asyncio.Future[CommandResult]"]


class ScriptedHost(CommandOnlyHost):
    """A host whose nvidia-smi answers come from lists: one-shot replies and loop streams."""

    def __init__(self, gpu: list[Reply], apps: list[Reply], streams: list[list[str]] | None = None) -> None:
        self.gpu = gpu
        self.apps = apps
        self.streams = streams or []
        self.calls: list[list[str]] = []
        self.stream_calls: list[list[str]] = []
        self.closed_streams = 0
        self.apps_cancelled = 0

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        self.calls.append(list(argv))
        replies = self.apps if argv[1].startswith("--query-compute-apps") else self.gpu
        reply = replies.pop(0) if len(replies) > 1 else replies[0]
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, CommandResult):
            return reply
        try:
            return await reply()
        except asyncio.CancelledError:
            self.apps_cancelled += 1
            raise

    async def stream_lines(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> AsyncIterator[str]:
        self.stream_calls.append(list(argv))
        lines = self.streams.pop(0) if self.streams else []
        try:
            for line in lines:
                if line == "<hang>":
                    await asyncio.Event().wait()
                if line.startswith("<raise>"):
                    raise HostError(line[7:])
                yield line
                await asyncio.sleep(0)
        finally:
            self.closed_streams += 1


def ok(stdout: str) -> CommandResult:
    return CommandResult(("nvidia-smi",), 0, stdout, "")


def failed(code: int, stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult(("nvidia-smi",), code, stdout, stderr)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fast(host: ScriptedHost, **kwargs: object) -> SmiTelemetry:
    return SmiTelemetry(host, backoff_s=(0.0, 0.0), **kwargs)  # type: ignore[arg-type]


async def take(stream: AsyncIterator[GpuSnapshot], count: int) -> list[GpuSnapshot]:
    out = []
    async for snapshot in stream:
        out.append(snapshot)
        if len(out) == count:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    return out


# ---- sample -------------------------------------------------------------------------------------------


async def test_sample_joins_processes_by_uuid_not_row_order() -> None:
    host = ScriptedHost([ok(TWO_GPUS)], [ok(APPS_BOTH)])
    snapshot = await SmiTelemetry(host).sample()
    assert snapshot.error is None
    gpu0, gpu1 = snapshot.gpus
    assert (gpu0.index, gpu0.uuid, gpu0.memory_used_mib, gpu0.source, gpu0.memory_api) == (0, H200, 527, "smi", "smi")
    assert [(p.pid, p.used_mib) for p in gpu0.processes or ()] == [(2002, 518)]
    assert [p.pid for p in gpu1.processes or ()] == [2001]
    assert gpu0.processes_taken_at is not None


async def test_sample_with_empty_compute_apps_means_no_processes() -> None:
    host = ScriptedHost([ok(TWO_GPUS)], [ok("")])
    snapshot = await SmiTelemetry(host).sample()
    assert [g.processes for g in snapshot.gpus] == [(), ()]
    assert all("processes" not in g.unavailable for g in snapshot.gpus)


async def test_failed_compute_apps_is_unknown_never_empty() -> None:
    host = ScriptedHost([ok(TWO_GPUS)], [failed(4, "Insufficient Permissions\n")])
    snapshot = await SmiTelemetry(host).sample()
    assert snapshot.error is None
    for gpu in snapshot.gpus:
        assert gpu.processes is None
        assert "Insufficient Permissions" in gpu.unavailable["processes"]


async def test_argv_lists_and_index_filter() -> None:
    host = ScriptedHost([ok(ROW1 + "\n")], [ok("")])
    snapshot = await SmiTelemetry(host, indices=[1]).sample()
    assert [g.index for g in snapshot.gpus] == [1]
    assert all(call[-2:] == ["-i", "1"] for call in host.calls)


async def test_missing_nvidia_smi_is_an_error_snapshot() -> None:
    host = ScriptedHost([failed(127, "", "sh: 1: nvidia-smi: not found\n")], [failed(127)])
    snapshot = await SmiTelemetry(host).sample()
    assert snapshot.gpus == ()
    assert snapshot.error is not None
    assert snapshot.error.kind == "not_found"


async def test_output_that_is_all_garbage_is_an_error_not_zero_gpus() -> None:
    host = ScriptedHost([ok("Segmentation fault\nwho knows, what\n")], [ok("")])
    snapshot = await SmiTelemetry(host).sample()
    assert snapshot.gpus == ()
    assert snapshot.error is not None
    assert snapshot.error.kind == "garbage"
    assert "Segmentation fault" in snapshot.error.message
    assert "command -v nvidia-smi" in snapshot.error.hint


async def test_host_exception_becomes_an_error_snapshot() -> None:
    host = ScriptedHost([HostError("gpu-box: connection lost")], [HostError("gpu-box: connection lost")])
    snapshot = await SmiTelemetry(host).sample()
    assert snapshot.error is not None
    assert "connection lost" in snapshot.error.message
    assert "gpu-box" in snapshot.error.hint


async def test_one_gpu_lost_keeps_the_others_and_reports_the_error() -> None:
    stdout = ROW0 + "\nUnable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system" \
        " to recover this GPU\n"
    host = ScriptedHost([failed(15, stdout)], [ok("")])
    snapshot = await SmiTelemetry(host).sample()
    assert [g.index for g in snapshot.gpus] == [0]
    assert snapshot.error is not None
    assert snapshot.error.kind == "lost"
    assert snapshot.skipped_lines == 1


async def test_bad_field_rc2_is_an_error() -> None:
    host = ScriptedHost([failed(2, 'Field "bogus.field" is not a valid field to query.\n\n')], [ok("")])
    snapshot = await SmiTelemetry(host).sample()
    assert snapshot.gpus == ()
    assert snapshot.error is not None
    assert snapshot.error.kind == "bad_field"


# ---- stream -------------------------------------------------------------------------------------------


async def test_stream_groups_loop_rows_into_ticks_and_counts_noise() -> None:
    loop = (DATA / "loop_with_events.txt").read_text().splitlines()
    host = ScriptedHost([ok(TWO_GPUS)], [ok(APPS_BOTH)], streams=[[*loop, "<hang>"]])
    snapshots = await take(fast(host).stream(period_ms=50), 3)
    first, tick1, tick2 = snapshots
    assert [g.index for g in first.gpus] == [0, 1]
    assert [g.memory_used_mib for g in tick1.gpus] == [0, 4]
    assert tick1.skipped_lines == 0  # the header and the blank line are expected
    # tick 2: GPU 1 fell off the bus; its row keeps its place, index and uuid from the first sample
    assert tick2.skipped_lines == 2  # the Xid event and the infoROM warning
    gpu0, gpu1 = tick2.gpus
    assert gpu0.power_w == 127.90
    assert (gpu1.index, gpu1.uuid, gpu1.memory_used_mib) == (1, A100, None)
    assert gpu1.unavailable["memory_used_mib"] == "[GPU is lost]"
    assert host.stream_calls[0][-2:] == ["-lms", "50"]
    assert host.closed_streams == 1  # closing the consumer closed the loop on the host


async def test_index_going_backwards_flushes_a_partial_tick() -> None:
    host = ScriptedHost([ok(TWO_GPUS)], [ok("")], streams=[[ROW0, ROW0, ROW1, "<hang>"]])
    _, partial, full = await take(fast(host).stream(period_ms=50), 3)
    assert [g.index for g in partial.gpus] == [0]
    assert [g.index for g in full.gpus] == [0, 1]


async def test_loop_exit_yields_error_then_restarts() -> None:
    stream1 = [ROW0, ROW1, "\x00stderr:Failed to initialize NVML: Driver/library version mismatch", "\x00exit:18"]
    stream2 = [ROW0, ROW1, "<hang>"]
    host = ScriptedHost([ok(TWO_GPUS)], [ok("")], streams=[stream1, stream2])
    snapshots = await take(fast(host).stream(period_ms=50), 5)
    kinds = [s.error.kind if s.error else None for s in snapshots]
    assert kinds == [None, None, "driver", None, None]  # sample, tick, error, sample (restart), tick
    assert snapshots[2].error is not None
    assert snapshots[2].error.exit_code == 18
    assert len(host.stream_calls) == 2


async def test_host_error_inside_the_loop_becomes_a_snapshot() -> None:
    streams = [[ROW0, "<raise>ssh: connection reset"], [ROW0, ROW1, "<hang>"]]
    host = ScriptedHost([ok(TWO_GPUS)], [ok("")], streams=streams)
    snapshots = await take(fast(host).stream(period_ms=50), 3)
    assert snapshots[1].error is not None
    assert "connection reset" in snapshots[1].error.message


async def test_eof_with_exit_zero_still_reports_and_restarts() -> None:
    host = ScriptedHost([ok(TWO_GPUS)], [ok("")], streams=[[ROW0, ROW1, "\x00exit:0"], [ROW0, ROW1, "<hang>"]])
    snapshots = await take(fast(host).stream(period_ms=50), 5)  # sample, tick, error, sample, tick
    assert snapshots[2].error is not None
    assert "ended" in snapshots[2].error.message
    assert snapshots[4].error is None
    assert len(snapshots[4].gpus) == 2
    assert len(host.stream_calls) == 2


async def test_failing_first_sample_is_retried_without_starting_a_loop() -> None:
    host = ScriptedHost([failed(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
                         ok(TWO_GPUS)], [ok("")], streams=[[ROW0, ROW1, "<hang>"]])
    snapshots = await take(fast(host).stream(period_ms=50), 3)
    assert snapshots[0].error is not None
    assert snapshots[0].error.kind == "driver"
    assert snapshots[1].error is None
    assert len(snapshots[1].gpus) == 2
    assert len(host.stream_calls) == 1


# ---- the process-list rule ----------------------------------------------------------------------------


async def test_tick_gets_a_fresh_process_list_from_a_one_shot() -> None:
    clock = Clock()
    host = ScriptedHost([ok(TWO_GPUS)], [ok(APPS_BOTH), ok("")], streams=[[ROW0, ROW1, "<hang>"]])
    telemetry = fast(host, clock=clock)
    stream = telemetry.stream(period_ms=50)
    first = await anext(stream)
    assert [p.pid for p in first.gpus[0].processes or ()] == [2002]
    clock.now += 2.0  # the next compute-apps query is due
    tick = await anext(stream)
    await stream.aclose()
    # nvidia-smi printed nothing, exit 0: that is "no processes", from a query that started after the first
    assert [g.processes for g in tick.gpus] == [(), ()]
    assert tick.gpus[0].processes_taken_at == 102.0


async def test_process_query_not_due_reuses_the_last_list() -> None:
    clock = Clock()
    host = ScriptedHost([ok(TWO_GPUS)], [ok(APPS_BOTH), ok("")], streams=[[ROW0, ROW1, "<hang>"]])
    stream = fast(host, clock=clock).stream(period_ms=50)
    first = await anext(stream)
    tick = await anext(stream)  # same instant: apps not due
    await stream.aclose()
    assert tick.gpus[0].processes == first.gpus[0].processes
    assert tick.gpus[0].processes_taken_at == first.gpus[0].processes_taken_at == 100.0
    assert sum(1 for c in host.calls if "compute-apps" in c[1]) == 1


async def test_slow_process_query_keeps_the_stale_list_then_drops_it() -> None:
    clock = Clock()
    release = asyncio.Event()

    async def slow() -> CommandResult:
        await release.wait()
        return ok("")

    host = ScriptedHost([ok(TWO_GPUS)], [ok(APPS_BOTH), slow], streams=[[ROW0, ROW1, ROW0, ROW1, ROW0, ROW1, "<hang>"]])
    stream = fast(host, clock=clock, apps_max_age_s=10.0).stream(period_ms=50)
    await anext(stream)
    clock.now += 2.0
    stale = await anext(stream)  # query in flight: the old list (still showing 2002) is kept
    assert [p.pid for p in stale.gpus[0].processes or ()] == [2002]
    assert stale.gpus[0].processes_taken_at == 100.0
    clock.now += 20.0
    dropped = await anext(stream)  # too old now: unknown, never "no processes"
    assert dropped.gpus[0].processes is None
    assert "old" in dropped.gpus[0].unavailable["processes"]
    await stream.aclose()
    assert host.apps_cancelled == 1  # closing the stream cancelled the query in flight


async def test_failed_process_query_in_the_loop_is_unknown() -> None:
    clock = Clock()
    host = ScriptedHost([ok(TWO_GPUS)], [ok(APPS_BOTH), HostError("gpu-box: channel closed")],
                        streams=[[ROW0, ROW1, "<hang>"]])
    stream = fast(host, clock=clock).stream(period_ms=50)
    await anext(stream)
    clock.now += 2.0
    tick = await anext(stream)
    await stream.aclose()
    assert tick.gpus[0].processes is None
    assert "channel closed" in tick.gpus[0].unavailable["processes"]


@pytest.mark.parametrize("period_ms", [0, -5])
async def test_silly_periods_are_clamped(period_ms: int) -> None:
    host = ScriptedHost([ok(TWO_GPUS)], [ok("")], streams=[[ROW0, ROW1, "<hang>"]])
    await take(fast(host).stream(period_ms=period_ms), 2)
    assert host.stream_calls[0][-1] == "50"
