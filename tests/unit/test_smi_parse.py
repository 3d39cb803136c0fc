"""nvidia-smi CSV parsers on the real outputs of docs/gpus.md: tokens, units, noise, never raise."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.telemetry.smi_parse import (
    APPS_FIELDS,
    GPU_FIELDS,
    apps_query_argv,
    classify_smi_failure,
    gpu_query_argv,
    missing_reason,
    parse_compute_apps_csv,
    parse_gpu_csv,
    parse_value,
)
from tests.helpers import DATA as TEST_DATA

DATA = TEST_DATA / "smi"
H200 = "GPU-529c853d-7a5b-f0b8-3c1e-2d4b5e6f7a81"
A100 = "GPU-7f3e2a10-1111-2222-3333-444455556666"


def read(name: str) -> str:
    return (DATA / name).read_bytes().decode()


def test_idle_h200_row_reads_every_field() -> None:
    rows, skipped = parse_gpu_csv(read("h200_idle.csv"))
    assert skipped == 0
    (row,) = rows
    assert (row.index, row.uuid, row.name) == (0, H200, "NVIDIA H200")
    assert (row.memory_used_mib, row.memory_total_mib) == (0, 143771)
    assert (row.utilization_pct, row.temperature_c, row.power_w) == (0, 38, 127.83)
    assert row.unavailable == {}


def test_zero_is_a_value_not_a_missing_reading() -> None:
    (row,), _ = parse_gpu_csv(read("h200_idle.csv"))
    assert row.memory_used_mib == 0
    assert "memory_used_mib" not in row.unavailable


@pytest.mark.parametrize(
    ("index", "field", "token"),
    [
        (0, "memory_used_mib", "[N/A]"),  # GB10 unified memory
        (0, "power_w", "[N/A]"),
        (1, "utilization_pct", "[Not Supported]"),  # older GeForce drivers
        (1, "power_w", "[Not Supported]"),
        (2, "power_w", "[Unknown Error]"),
        (3, "memory_used_mib", "[Insufficient Permissions]"),  # MIG slice in a container
        (3, "memory_total_mib", "[Insufficient Permissions]"),
        (4, "temperature_c", "[GPU requires reset]"),
        (5, "temperature_c", "N/A"),  # bare, driver 440.64
        (5, "power_w", "ERR!"),
    ],
)
def test_every_missing_token_is_none_with_its_text_as_reason(index: int, field: str, token: str) -> None:
    rows, skipped = parse_gpu_csv(read("tokens.csv"))
    assert skipped == 0
    row = rows[index]
    assert getattr(row, field) is None
    assert row.unavailable[field] == token


def test_lost_gpu_row_is_kept_with_every_field_missing() -> None:
    line = ", ".join(["[GPU is lost]"] * len(GPU_FIELDS))
    rows, skipped = parse_gpu_csv(line)
    assert skipped == 0
    (row,) = rows
    assert row.index is None
    assert row.uuid is None
    assert row.memory_used_mib is None
    assert set(row.unavailable.values()) == {"[GPU is lost]"}


@pytest.mark.parametrize("cell", ["[N/A]", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]",
                                  "[GPU is lost]", "[GPU requires reset]", "N/A", "n/a", "ERR!",
                                  "Not Supported", " [N/A] "])
def test_missing_tokens(cell: str) -> None:
    assert missing_reason(cell) == cell.strip()
    assert parse_value(cell) == (None, cell.strip())


@pytest.mark.parametrize(
    ("cell", "value"),
    [("0", 0.0), ("143771", 143771.0), ("127.83", 127.83), ("0 MiB", 0.0), ("143771 MiB", 143771.0),
     ("7 %", 7.0), ("127.83 W", 127.83), ("112 MB", 112.0), ("1980 MHz", 1980.0), (" 38 ", 38.0)],
)
def test_units_that_slipped_in_are_tolerated(cell: str, value: float) -> None:
    assert parse_value(cell) == (value, None)


def test_rows_with_units_parse_like_nounits() -> None:
    rows, skipped = parse_gpu_csv(read("units_slipped.csv"))
    assert skipped == 0
    assert [(r.memory_used_mib, r.memory_total_mib, r.utilization_pct, r.power_w) for r in rows] == [
        (0, 143771, 0, 127.83),
        (112, 4743, 7, 25.10),
    ]


def test_unreadable_number_is_none_with_reason_not_zero() -> None:
    (row,), _ = parse_gpu_csv(f"0, {H200}, lots, 143771, 0, 38, 127.83, NVIDIA H200")
    assert row.memory_used_mib is None
    assert "lots" in row.unavailable["memory_used_mib"]


def test_header_with_units_blank_lines_and_events_in_loop_output() -> None:
    rows, skipped = parse_gpu_csv(read("loop_with_events.txt"))
    assert [r.index for r in rows] == [0, 1, 0, None]
    assert skipped == 2  # the Xid line and the infoROM warning; header and blank line are not counted


def test_crlf_line_endings() -> None:
    rows, skipped = parse_gpu_csv(read("crlf.csv"))
    assert skipped == 0
    assert [(r.index, r.name, r.power_w) for r in rows] == [(0, "NVIDIA H200", 127.83), (1, "NVIDIA H200", 125.10)]
    rows, _ = parse_gpu_csv([f"0, {H200}, 0, 143771, 0, 38, 127.83, NVIDIA H200\r"])
    assert rows[0].name == "NVIDIA H200"


def test_lines_iterable_is_accepted() -> None:
    rows, skipped = parse_gpu_csv(read("two_gpus.csv").splitlines())
    assert [r.uuid for r in rows] == [H200, A100]
    assert skipped == 0


def test_wrong_field_count_is_skipped_and_counted() -> None:
    text = f"0, {H200}, 0, 143771\n0, {H200}, 0, 143771, 0, 38, 127.83, NVIDIA H200\nNo devices were found\n"
    rows, skipped = parse_gpu_csv(text)
    assert len(rows) == 1
    assert skipped == 2


def test_name_with_commas_survives_because_it_is_last() -> None:
    (row,), _ = parse_gpu_csv(f"0, {H200}, 0, 143771, 0, 38, 127.83, Vendor, Model, Rev 2")
    assert row.name == "Vendor, Model, Rev 2"


def test_custom_field_list_with_timestamp_first() -> None:
    fields = ("timestamp", *GPU_FIELDS)
    (row,), skipped = parse_gpu_csv(f"2026/11/30 05:52:58.025, 0, {H200}, 0, 143771, 0, 38, 127.83, NVIDIA H200",
                                    fields)
    assert skipped == 0
    assert row.timestamp == "2026/11/30 05:52:58.025"
    assert row.memory_total_mib == 143771


def test_compute_apps_rows_keep_commas_in_process_names_and_gpu_uuid() -> None:
    processes, skipped = parse_compute_apps_csv(read("apps_mixed.csv"))
    assert skipped == 0
    assert [(p.gpu_uuid, p.pid, p.used_mib) for p in processes] == [
        (A100, 2001, 9104), (H200, 2002, 518), (H200, 79, None), (A100, 3003, 300)
    ]
    assert processes[0].name == "python -m sglang.launch_server --model-path a,b --tp 2"
    assert processes[3].name == "[Insufficient Permissions]"


def test_empty_compute_apps_output_is_no_processes() -> None:
    assert parse_compute_apps_csv(read("apps_empty.csv")) == ([], 0)
    assert classify_smi_failure(0, read("apps_empty.csv"), "") is None


def test_compute_apps_header_and_noise() -> None:
    text = (
        "gpu_uuid, pid, used_gpu_memory [MiB], process_name\n"
        f"{H200}, 48921, 518 MiB, python3\r\n"
        "No running processes found\n"
        f"{H200}, notapid, 518, python3\n"
    )
    processes, skipped = parse_compute_apps_csv(text)
    assert [(p.pid, p.used_mib, p.name) for p in processes] == [(48921, 518, "python3")]
    assert skipped == 2


def test_argv_puts_free_text_last_and_uses_nounits() -> None:
    argv = gpu_query_argv(indices=[1, 0], loop_ms=500)
    assert argv[:3] == [
        "nvidia-smi",
        "--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw,name",
        "--format=csv,noheader,nounits",
    ]
    assert argv[3:] == ["-i", "1,0", "-lms", "500"]
    assert apps_query_argv() == [
        "nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory,process_name", "--format=csv,noheader,nounits"
    ]
    assert APPS_FIELDS[-1] == "process_name"
    assert GPU_FIELDS[-1] == "name"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parsers_never_raise_on_arbitrary_text(text: str) -> None:
    rows, skipped = parse_gpu_csv(text)
    processes, skipped_apps = parse_compute_apps_csv(text)
    lines = len(text.splitlines())
    assert len(rows) + skipped <= lines
    assert len(processes) + skipped_apps <= lines
    classify_smi_failure(None, text, text)
    classify_smi_failure(3, text, "")


_cell = st.one_of(
    st.sampled_from(["[N/A]", "N/A", "ERR!", "[GPU is lost]", "0", "12 MiB", "", ",", "\r", "[", "]"]),
    st.text(max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_cell, min_size=0, max_size=10), max_size=8),
       st.sampled_from(["\n", "\r\n", "\r"]))
def test_parsers_never_raise_on_csv_shaped_garbage(table: list[list[str]], newline: str) -> None:
    text = newline.join(", ".join(cells) for cells in table)
    rows, _ = parse_gpu_csv(text)
    for row in rows:  # a missing value is never turned into a number
        for name, reason in row.unavailable.items():
            assert getattr(row, name, None) is None, (name, reason)
    parse_compute_apps_csv(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40), max_size=6))
def test_valid_rows_survive_any_interleaved_noise(noise: list[str]) -> None:
    good = read("two_gpus.csv").splitlines()
    noisy = [n for n in noise if "," not in n]  # noise of another shape: never a row
    rows, skipped = parse_gpu_csv([good[0], *noisy, good[1]])
    assert [r.uuid for r in rows] == [H200, A100]
    assert skipped <= len(noisy)
