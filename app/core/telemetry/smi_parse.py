"""nvidia-smi CSV: the query argv, line parsers that never raise, and failure classification.

Everything here is pure (no I/O), so it is tested on the real outputs shown in docs/gpus.md.

Public API:

- ``GPU_FIELDS`` / ``GPU_LOOP_FIELDS`` / ``APPS_FIELDS``: the field lists tunedash queries. Free text
  (``name``, ``process_name``) is always last so a comma inside it survives (split with a maxsplit).
- ``gpu_query_argv(fields, indices=None, loop_ms=None)`` and ``apps_query_argv(indices=None)``: argv lists.
- ``parse_gpu_csv(text_or_lines, fields=GPU_FIELDS) -> (list[SmiGpuRow], skipped)``
- ``parse_compute_apps_csv(text_or_lines) -> (list[GpuProcess], skipped)``
- ``parse_value(raw) -> (number | None, reason | None)``: one cell; missing tokens become None + reason.
- ``classify_smi_failure(returncode, stdout, stderr) -> TelemetryError | None``

Parsing rules (docs/gpus.md#queries-tunedash-runs): lines are split on "," with a maxsplit of len(fields) - 1
and each cell is stripped (a trailing "\\r" too). A line whose field count is wrong, or whose ``index``/``pid``
is not a number, is skipped and counted (Xid and infoROM warnings interleaved in loop mode, failure messages,
anything else). Blank lines and the CSV header line (``index, uuid, memory.used [MiB], ...``, printed once when
``noheader`` is missing) are skipped without being counted. Any cell that matches ``[...]`` or is one of
``N/A``, ``ERR!``, ``Not Supported`` (case-insensitive) is None with the cell text as the reason, never 0. Units
that slipped in despite ``nounits`` (`` MiB``, `` MB``, `` %``, `` W``, `` MHz``, `` C``) are tolerated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app.core.data import GpuProcess, TelemetryError

GPU_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
    "name",
)
GPU_LOOP_FIELDS = GPU_FIELDS  # ticks are grouped by index order (see app.core.telemetry.smi), not timestamps
APPS_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_memory", "process_name")
CSV_FORMAT = "--format=csv,noheader,nounits"

# field name (or alias) -> SmiGpuRow attribute and the kind of value it holds
_GPU_COLUMNS: dict[str, tuple[str, str]] = {
    "index": ("index", "int"),
    "uuid": ("uuid", "text"),
    "gpu_uuid": ("uuid", "text"),
    "name": ("name", "text"),
    "gpu_name": ("name", "text"),
    "memory.used": ("memory_used_mib", "int"),
    "memory.total": ("memory_total_mib", "int"),
    "utilization.gpu": ("utilization_pct", "int"),
    "temperature.gpu": ("temperature_c", "int"),
    "power.draw": ("power_w", "float"),
    "timestamp": ("timestamp", "text"),
}

_MISSING_WORDS = frozenset({"n/a", "err!", "not supported"})
_UNIT_RE = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?:MiB|MB|%|W|MHz|C)?\s*$", re.IGNORECASE)
_HEADER_RE = re.compile(r"^\s*(?:timestamp|index|uuid|gpu_uuid|gpu_name|pid)\s*(?:\[[^\]]*\])?\s*,")


@dataclass(frozen=True)
class SmiGpuRow:
    """One parsed --query-gpu line. None means unreadable; `unavailable` maps the field to the cell text."""

    index: int | None
    uuid: str | None = None
    name: str | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    timestamp: str | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)  # cells of fields this module does not model


def missing_reason(cell: str) -> str | None:
    """The reason when a cell is a "not a value" token ("[N/A]", "ERR!", ...), else None."""
    text = cell.strip()
    if len(text) >= 2 and text.startswith("[") and text.endswith("]"):
        return text
    if text.lower() in _MISSING_WORDS:
        return text
    return None


def parse_value(cell: str) -> tuple[float | None, str | None]:
    """A numeric cell -> (value, None), or (None, reason) for a missing token, empty or unreadable text."""
    reason = missing_reason(cell)
    if reason is not None:
        return None, reason
    match = _UNIT_RE.match(cell)
    if match is None:
        text = cell.strip()
        return None, f"unreadable: {text!r}" if text else "empty"
    try:
        return float(match.group(1)), None
    except ValueError:  # pragma: no cover - the regex only lets numbers through
        return None, f"unreadable: {cell.strip()!r}"


def _as_int(cell: str) -> tuple[int | None, str | None]:
    value, reason = parse_value(cell)
    if value is None:
        return None, reason
    if not math.isfinite(value):  # "9" * 400 reads as inf: not a number nvidia-smi prints
        return None, f"not a finite number: {cell[:40]!r}"
    return round(value), None


def _lines(text_or_lines: str | Iterable[str]) -> Iterable[str]:
    if isinstance(text_or_lines, str):
        return text_or_lines.splitlines()
    return text_or_lines


def _cells(line: str, count: int) -> list[str] | None:
    """Split one CSV line into exactly `count` stripped cells (the last keeps its commas), or None."""
    parts = line.rstrip("\r\n").split(",", count - 1)
    if len(parts) != count:
        return None
    return [part.strip().rstrip("\r") for part in parts]


def is_ignorable_line(line: str) -> bool:
    """Blank lines and CSV header lines: expected noise, skipped without being counted."""
    stripped = line.strip()
    return not stripped or _HEADER_RE.match(stripped) is not None


def parse_gpu_line(line: str, fields: Sequence[str] = GPU_FIELDS) -> SmiGpuRow | None:
    """One --query-gpu line -> a row, or None when the line is not a row (wrong shape, non-numeric index).

    A row must have the right number of cells and an ``index`` cell that is a number or a missing token
    ("[GPU is lost]": a lost GPU reads as a row with index None), and a ``uuid`` cell that looks like a
    GPU/MIG uuid or is a missing token.
    """
    if not fields:
        return None
    cells = _cells(line, len(fields))
    if cells is None:
        return None
    values: dict[str, int | float | str | None] = {}
    unavailable: dict[str, str] = {}
    extra: dict[str, str] = {}
    for name, cell in zip(fields, cells, strict=True):
        column = _GPU_COLUMNS.get(name)
        if column is None:
            extra[name] = cell
            continue
        attr, kind = column
        if kind == "text":
            reason = missing_reason(cell) if attr != "timestamp" else None
            if reason is not None or not cell:
                values[attr] = None
                unavailable[attr] = reason or "empty"
            else:
                values[attr] = cell
            continue
        number: int | float | None
        if kind == "int":
            number, reason = _as_int(cell)
        else:
            number, reason = parse_value(cell)
        if attr == "index" and number is None and missing_reason(cell) is None:
            return None  # "index" must be a number or a token: anything else is not a row
        values[attr] = number
        if reason is not None:
            unavailable[attr] = reason
    uuid = values.get("uuid")
    if isinstance(uuid, str) and not uuid.upper().startswith(("GPU-", "MIG-")):
        return None
    return _row(values, unavailable, extra)


def _row(
    values: dict[str, int | float | str | None], unavailable: dict[str, str], extra: dict[str, str]
) -> SmiGpuRow:
    def as_int(key: str) -> int | None:
        value = values.get(key)
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    def as_str(key: str) -> str | None:
        value = values.get(key)
        return value if isinstance(value, str) else None

    power = values.get("power_w")
    return SmiGpuRow(
        index=as_int("index"),
        uuid=as_str("uuid"),
        name=as_str("name"),
        memory_used_mib=as_int("memory_used_mib"),
        memory_total_mib=as_int("memory_total_mib"),
        utilization_pct=as_int("utilization_pct"),
        temperature_c=as_int("temperature_c"),
        power_w=float(power) if isinstance(power, int | float) else None,
        timestamp=as_str("timestamp"),
        unavailable=unavailable,
        extra=extra,
    )


def parse_gpu_csv(
    text_or_lines: str | Iterable[str], fields: Sequence[str] = GPU_FIELDS
) -> tuple[list[SmiGpuRow], int]:
    """All --query-gpu rows in the text, and how many non-blank, non-header lines were skipped."""
    rows: list[SmiGpuRow] = []
    skipped = 0
    for line in _lines(text_or_lines):
        if is_ignorable_line(line):
            continue
        row = parse_gpu_line(line, fields)
        if row is None:
            skipped += 1
        else:
            rows.append(row)
    return rows, skipped


def parse_apps_line(line: str) -> GpuProcess | None:
    """One ``gpu_uuid, pid, used_memory, process_name`` line -> a process, or None when it is not one.

    used_memory "[N/A]" (WDDM) gives used_mib None. A process_name token such as "[Insufficient
    Permissions]" is kept as the name: it says why the name is unknown.
    """
    cells = _cells(line, len(APPS_FIELDS))
    if cells is None:
        return None
    uuid, pid_cell, memory_cell, name = cells
    if not uuid.upper().startswith(("GPU-", "MIG-")):
        return None
    if not (pid_cell.isascii() and pid_cell.isdigit()):  # str.isdigit() also takes '²'
        return None
    pid = int(pid_cell)
    used_mib, _ = _as_int(memory_cell)
    return GpuProcess(pid=pid, name=name, used_mib=used_mib, gpu_uuid=uuid)


def parse_compute_apps_csv(text_or_lines: str | Iterable[str]) -> tuple[list[GpuProcess], int]:
    """All processes in --query-compute-apps output (empty stdout: no processes), and the skipped count."""
    processes: list[GpuProcess] = []
    skipped = 0
    for line in _lines(text_or_lines):
        if is_ignorable_line(line):
            continue
        process = parse_apps_line(line)
        if process is None:
            skipped += 1
        else:
            processes.append(process)
    return processes, skipped


def gpu_query_argv(
    fields: Sequence[str] = GPU_FIELDS,
    indices: Sequence[int] | None = None,
    loop_ms: int | None = None,
    executable: str = "nvidia-smi",
) -> list[str]:
    """The --query-gpu argv; ``loop_ms`` adds ``-lms`` (the command then never exits by itself)."""
    argv = [executable, "--query-gpu=" + ",".join(fields), CSV_FORMAT]
    if indices:
        argv += ["-i", ",".join(str(int(i)) for i in indices)]
    if loop_ms is not None:
        argv += ["-lms", str(int(loop_ms))]
    return argv


def apps_query_argv(indices: Sequence[int] | None = None, executable: str = "nvidia-smi") -> list[str]:
    """The one-shot --query-compute-apps argv."""
    argv = [executable, "--query-compute-apps=" + ",".join(APPS_FIELDS), CSV_FORMAT]
    if indices:
        argv += ["-i", ",".join(str(int(i)) for i in indices)]
    return argv


# ---- failure classification -------------------------------------------------------------------------

FAILURE_HINTS: dict[str, str] = {
    "not_found": "nvidia-smi is not installed or not on PATH on this host: install the NVIDIA driver "
    "utilities, or add their folder to PATH for non-interactive shells.",
    "driver": "The NVIDIA driver is not usable: check `lsmod | grep nvidia` and `dmesg`, reinstall or "
    "rebuild the driver for the running kernel, or start the container with --gpus all.",
    "mismatch": "The NVIDIA user-space libraries and the loaded kernel module differ (a driver upgrade "
    "without reboot): reboot the host or reload the nvidia kernel modules.",
    "library": "libnvidia-ml.so is missing: install the NVIDIA driver utilities, or run the container "
    "with NVIDIA_DRIVER_CAPABILITIES including 'utility'.",
    "cgroup": "NVML lost access to the devices (typical in a container after a systemd reload): recreate "
    "the container; the host itself is usually fine.",
    "no_devices": "No GPU is visible: check the GPU indices in the profile (`nvidia-smi -L` lists them), "
    "CUDA_VISIBLE_DEVICES, or the container's --gpus option.",
    "bad_field": "This nvidia-smi does not know one of the queried fields (an older driver): run "
    "`nvidia-smi --help-query-gpu` on the host and report the driver version.",
    "lost": "A GPU fell off the bus or needs a reset (Xid 79): check `dmesg`, then reset the GPU "
    "(`nvidia-smi -r`) or reboot the host.",
    "permission": "Not allowed to read the GPUs: run as a user with access to /dev/nvidia*, or give the "
    "container the devices (MIG slices hide the parent GPU's memory from unprivileged containers).",
    "os_blocked": "The operating system blocks GPU access (WSL2/GPU-PV): enable GPU support for the VM.",
    "inforom": "nvidia-smi reports a corrupted infoROM; the readings may still be valid: ask the host's "
    "administrator to check the GPU (`nvidia-smi -q`).",
    "other": "nvidia-smi failed: run the same command on the host by hand to see the full message.",
}

# (substring, lowercase compare) -> (kind, hint key); first match wins, checked before the exit code
_MESSAGES: tuple[tuple[str, str, str], ...] = (
    ("couldn't find libnvidia-ml.so", "driver", "library"),
    ("nvml shared library not found", "driver", "library"),
    ("couldn't communicate with the nvidia driver", "driver", "driver"),
    ("driver/library version mismatch", "driver", "mismatch"),
    ("nvml/rm version mismatch", "driver", "mismatch"),
    ("driver not loaded", "driver", "driver"),
    ("gpu access blocked by the operating system", "permission", "os_blocked"),
    ("failed to initialize nvml: insufficient permissions", "permission", "permission"),
    ("failed to initialize nvml: unknown error", "driver", "cgroup"),
    ("no devices were found", "no_devices", "no_devices"),
    ("is not a valid field to query", "bad_field", "bad_field"),
    ("gpu is lost", "lost", "lost"),
    ("gpu requires reset", "lost", "lost"),
    ("inforom is corrupted", "other", "inforom"),
    ("corrupted inforom", "other", "inforom"),
    ("insufficient permissions", "permission", "permission"),
    ("permission denied", "permission", "permission"),
    ("command not found", "not_found", "not_found"),
    ("nvidia-smi: not found", "not_found", "not_found"),
    ("no such file or directory", "not_found", "not_found"),
)

_CODES: dict[int, tuple[str, str]] = {
    2: ("bad_field", "bad_field"),
    4: ("permission", "permission"),
    6: ("no_devices", "no_devices"),
    9: ("driver", "driver"),
    12: ("driver", "library"),
    14: ("other", "inforom"),
    15: ("lost", "lost"),
    18: ("driver", "mismatch"),
    126: ("permission", "permission"),
    127: ("not_found", "not_found"),
}

_BRACKETED = re.compile(r"\[[^\]\n]*\]")
_ROW_LIKE = re.compile(r"^\s*(?:\d+|GPU-|MIG-|\[)[^,]*,")


def _normalise(text: str) -> str:
    """Lowercase, curly apostrophes made straight, bracketed cell values removed, whitespace collapsed."""
    text = _BRACKETED.sub(" ", text.replace("\u2018", "'").replace("\u2019", "'"))
    return " ".join(text.split()).lower()


def _message_lines(stdout: str, stderr: str) -> str:
    """The lines that are not CSV rows: the tool's own message, verbatim."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in stdout.splitlines():
        if line.strip() and _ROW_LIKE.match(line) is None:
            lines.append(line.strip())
    return "\n".join(lines)


def classify_smi_failure(returncode: int | None, stdout: str, stderr: str) -> TelemetryError | None:
    """A TelemetryError for a failed or warning nvidia-smi run, or None when it simply worked.

    Message substring first, exit code second (docs/gpus.md#exit-codes-and-failure-messages); bracketed cell
    values such as "[GPU is lost]" are not messages. rc 0 with no known message is success. Note that rows
    can still be valid alongside an error (rc 14 infoROM warning, rc 15 with one GPU lost): callers keep both.
    """
    message = _message_lines(stdout, stderr)
    haystack = _normalise(stdout + "\n" + stderr)
    for needle, kind, hint in _MESSAGES:
        if needle in haystack:
            if needle == "no such file or directory" and returncode not in (127, None):
                continue
            return TelemetryError(kind=kind, message=message or needle, exit_code=returncode, hint=FAILURE_HINTS[hint])
    if returncode in (0, None):
        return None
    kind, hint = _CODES.get(returncode, ("other", "other"))
    if returncode == 255 and not message:
        message = "exit code 255 with no message (nvidia-smi 'other error', or the connection failed)"
    return TelemetryError(
        kind=kind, message=message or f"nvidia-smi exited with code {returncode}", exit_code=returncode,
        hint=FAILURE_HINTS[hint],
    )
