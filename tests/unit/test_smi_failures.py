"""classify_smi_failure on the exact failure messages and exit codes of docs/gpus.md#exit-codes-and-failure-messages."""

from __future__ import annotations

import pytest

from app.core.telemetry.smi_parse import classify_smi_failure, parse_gpu_csv

COULD_NOT_COMMUNICATE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
# the blog-pasted variant: U+2018 apostrophe and a line break inside the sentence
COULD_NOT_COMMUNICATE_CURLY = (
    "NVIDIA-SMI has failed because it couldn\u2018t communicate with the NVIDIA\ndriver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.161\n"
MISMATCH_OLD = "Failed to initialize NVML: Driver/library version mismatch\n"
UNKNOWN = "Failed to initialize NVML: Unknown Error\n"
WSL_BLOCKED = (
    "Failed to initialize NVML: GPU access blocked by the operating system\n"
    "Failed to properly shut down NVML: GPU access blocked by the operating system\n"
)
NO_LIBRARY = (
    "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA "
    "Display Driver is properly installed and present in your system.\n"
    "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n"
)
NO_DEVICES = "No devices were found\n"
LOST = (
    "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this "
    "GPU\n"
)
LOST_WINDOWS = (
    "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost.  Reboot the system to recover "
    "this GPU\n"
)
BAD_FIELD = 'Field "bogus.field" is not a valid field to query.\n\n'
INFOROM = "WARNING: infoROM is corrupted at gpu 0008:00:00.0\n"


@pytest.mark.parametrize("where", ["stdout", "stderr"])
@pytest.mark.parametrize(
    ("text", "code", "kind"),
    [
        (COULD_NOT_COMMUNICATE, 9, "driver"),
        (COULD_NOT_COMMUNICATE_CURLY, 9, "driver"),
        (MISMATCH, 18, "driver"),
        (MISMATCH_OLD, 18, "driver"),
        (UNKNOWN, 255, "driver"),
        (WSL_BLOCKED, 255, "permission"),
        (NO_LIBRARY, 12, "driver"),
        (NO_DEVICES, 6, "no_devices"),
        (LOST, 15, "lost"),
        (LOST_WINDOWS, 15, "lost"),
        (BAD_FIELD, 2, "bad_field"),
        ("bash: line 1: nvidia-smi: command not found\n", 127, "not_found"),
        ("sh: 1: nvidia-smi: not found\n", 127, "not_found"),
    ],
)
def test_exact_messages_with_their_exit_codes(text: str, code: int, kind: str, where: str) -> None:
    stdout, stderr = (text, "") if where == "stdout" else ("", text)
    error = classify_smi_failure(code, stdout, stderr)
    assert error is not None
    assert error.kind == kind
    assert error.exit_code == code
    assert error.message == text.strip()  # the tool's own words, verbatim
    assert error.hint  # always says what to do


@pytest.mark.parametrize(
    ("text", "kind"),
    [(COULD_NOT_COMMUNICATE, "driver"), (NO_DEVICES, "no_devices"), (BAD_FIELD, "bad_field"), (LOST, "lost")],
)
def test_message_wins_over_exit_code(text: str, kind: str) -> None:
    # over SSH the code can be 255 (ambiguous) or wrapped: the text decides
    error = classify_smi_failure(255, text, "")
    assert error is not None
    assert error.kind == kind


@pytest.mark.parametrize(
    ("code", "kind"),
    [(2, "bad_field"), (4, "permission"), (6, "no_devices"), (9, "driver"), (12, "driver"), (15, "lost"),
     (18, "driver"), (127, "not_found"), (3, "other"), (255, "other"), (1, "other")],
)
def test_exit_code_alone_when_there_is_no_message(code: int, kind: str) -> None:
    error = classify_smi_failure(code, "", "")
    assert error is not None
    assert error.kind == kind
    assert error.message  # never empty


def test_success_is_none_even_with_bracketed_failure_values() -> None:
    stdout = (
        "0, GPU-a, [GPU is lost], [GPU is lost], [N/A], 30, [Insufficient Permissions], NVIDIA H200\n"
        "1, GPU-b, [GPU requires reset], 81920, 0, 30, 60.0, NVIDIA A100\n"
    )
    assert classify_smi_failure(0, stdout, "") is None


def test_mismatch_second_line_is_kept_in_the_message() -> None:
    error = classify_smi_failure(18, MISMATCH, "")
    assert error is not None
    assert "NVML library version: 535.161" in error.message
    assert "reboot" in error.hint.lower()


def test_inforom_warning_keeps_valid_rows_and_reports_the_warning() -> None:
    stdout = "0, GPU-529c853d-7a5b-f0b8-3c1e-2d4b5e6f7a81, 0, 143771, 0, 38, 127.83, NVIDIA H200\n" + INFOROM
    rows, skipped = parse_gpu_csv(stdout)
    assert [r.memory_used_mib for r in rows] == [0]
    assert skipped == 1
    error = classify_smi_failure(14, stdout, "")
    assert error is not None
    assert error.kind == "other"
    assert error.message == INFOROM.strip()  # the row is not part of the message
    assert "infoROM" in error.hint


def test_bad_field_message_names_the_field() -> None:
    error = classify_smi_failure(2, BAD_FIELD, "")
    assert error is not None
    assert 'Field "bogus.field"' in error.message


def test_ssh_255_without_text_says_it_is_ambiguous() -> None:
    error = classify_smi_failure(255, "", "")
    assert error is not None
    assert "connection" in error.message
