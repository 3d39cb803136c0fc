"""What the GPUs are made of: compute capability per GPU and the link between each pair (nvidia-smi).

Two one-shot queries, for the advisor's hardware rules (FlashInfer all-reduce fusion needs SM90+, NCCL NVLS
needs NVLink, ...):

- ``nvidia-smi --query-gpu=index,compute_cap --format=csv,noheader`` prints ``0, 9.0`` per GPU (the field has
  no unit; a real H200 prints ``9.0``, an RTX A6000 ``8.6``). ``parse_compute_caps`` reads it: a cell such as
  ``[N/A]`` is None with that text as the reason, never a guess; a line that is not a row is skipped and counted.
  A driver too old to know the field answers ``Field "compute_cap" is not a valid field to query.`` (rc 2).
- ``nvidia-smi topo -m`` prints a matrix: a header row (``GPU0 GPU1 ... NIC0 ... CPU Affinity NUMA Affinity
  GPU NUMA ID``, tab-separated and underlined with ANSI escapes even into a pipe), one row per GPU (then per
  NIC) with ``X`` on the diagonal, ``NV#`` for # bonded NVLinks, or the PCIe path (PIX, PXB, PHB, NODE, SYS;
  SOC is the older drivers' name for SYS), then a Legend block. ``parse_topology`` reads the GPU-to-GPU cells
  of tab-separated or space-aligned copies alike; NIC rows and columns, the affinity cells and the legend are
  not links. A line before the header or after it that is no device row, a GPU row it cannot read (too few
  cells, a second row for the same GPU) and a cell that is no known link are skipped and counted; two rows that
  disagree about a pair keep the first.

``read_gpu_facts(host, gpus)`` runs both over a Host and never raises: a failed query leaves its part empty
with the reason (the tool's own message, or the host's).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from app.core.hosts.base import Host
from app.core.telemetry.smi_parse import classify_smi_failure, missing_reason

NVLINK = "NVLink"
PCIE_PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_OLD_NAMES = {"SOC": "SYS"}  # drivers before 2017 printed SOC where today's print SYS
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU_NAME = re.compile(r"^GPU(\d+)$")
_NV_CELL = re.compile(r"^NV(\d+)$")
_CAPABILITY = re.compile(r"^(\d+)\.(\d+)$")
_QUERY_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ComputeCapability:
    """One GPU's compute capability (8.6 = SM86), or None with the reason it could not be read."""

    gpu: int
    major: int | None
    minor: int | None
    reason: str | None = None

    @property
    def sm(self) -> int | None:
        """The SM number (86 for 8.6), as kernels and SGLang's checks name it."""
        return None if self.major is None or self.minor is None else self.major * 10 + self.minor

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}" if self.reason is None else f"unknown ({self.reason})"


@dataclass(frozen=True)
class GpuLink:
    """How two GPUs reach each other: NVLink with its link count, or a PCIe path kind."""

    a: int  # the lower GPU index
    b: int
    kind: str  # NVLINK or one of PCIE_PATHS
    nvlinks: int | None = None  # bonded NVLinks (NVLINK only)

    @property
    def is_nvlink(self) -> bool:
        return self.kind == NVLINK


@dataclass(frozen=True)
class Topology:
    """The GPU-to-GPU part of `nvidia-smi topo -m`."""

    gpus: tuple[int, ...]  # the GPUs the matrix has rows for
    links: tuple[GpuLink, ...]
    skipped: int = 0  # rows and cells that were not readable

    def link(self, a: int, b: int) -> GpuLink | None:
        """The link between two GPUs, either order; None when the matrix did not say."""
        low, high = min(a, b), max(a, b)
        return next((link for link in self.links if (link.a, link.b) == (low, high)), None)

    def links_among(self, gpus: Sequence[int]) -> tuple[GpuLink | None, ...]:
        """The link of every pair of `gpus` (None for a pair the matrix did not say)."""
        ordered = sorted(set(gpus))
        return tuple(self.link(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1 :])

    def all_nvlink(self, gpus: Sequence[int]) -> bool | None:
        """Whether every pair of `gpus` is joined by NVLink; None when some pair is unknown or fewer than two."""
        links = self.links_among(gpus)
        if not links or any(link is None for link in links):
            return None
        return all(link is not None and link.is_nvlink for link in links)


@dataclass(frozen=True)
class GpuFacts:
    """Compute capabilities and topology of a host's GPUs; each part empty with its reason when unread."""

    capabilities: tuple[ComputeCapability, ...]
    topology: Topology | None
    capability_error: str | None = None
    topology_error: str | None = None
    skipped_lines: int = 0  # compute_cap lines that were not rows

    def capability(self, gpu: int) -> ComputeCapability | None:
        return next((cap for cap in self.capabilities if cap.gpu == gpu), None)

    @property
    def compute_cap(self) -> str | None:
        """The GPUs' compute capability ("8.6") when every GPU read one and they agree, else None."""
        texts = {str(cap) for cap in self.capabilities}
        if not self.capabilities or any(cap.reason for cap in self.capabilities) or len(texts) != 1:
            return None
        return texts.pop()

    @property
    def interconnect(self) -> str | None:
        """"nvlink" when every pair of the GPUs has NVLink, "pcie" when some pair has only a PCIe path, None
        when the topology was not read, some pair is unknown, or there is no pair."""
        if self.topology is None:
            return None
        nvlink = self.topology.all_nvlink(self.topology.gpus)
        return None if nvlink is None else "nvlink" if nvlink else "pcie"


def compute_cap_argv(indices: Sequence[int] | None = None, executable: str = "nvidia-smi") -> list[str]:
    argv = [executable, "--query-gpu=index,compute_cap", "--format=csv,noheader"]
    if indices:
        argv += ["-i", ",".join(str(i) for i in indices)]
    return argv


def topology_argv(executable: str = "nvidia-smi") -> list[str]:
    return [executable, "topo", "-m"]


def _lines(text_or_lines: str | Iterable[str]) -> Iterable[str]:
    return text_or_lines.splitlines() if isinstance(text_or_lines, str) else text_or_lines


def parse_capability(gpu: int, cell: str) -> ComputeCapability:
    """One compute_cap cell ("8.6", "[N/A]", junk) of GPU `gpu`."""
    text = cell.strip()
    reason = missing_reason(text)
    if reason is not None:
        return ComputeCapability(gpu, None, None, reason)
    match = _CAPABILITY.match(text)
    if match is None:
        return ComputeCapability(gpu, None, None, f"unreadable: {text[:40]!r}" if text else "empty")
    return ComputeCapability(gpu, int(match.group(1)), int(match.group(2)))


def parse_compute_caps(text_or_lines: str | Iterable[str]) -> tuple[list[ComputeCapability], int]:
    """`index, compute_cap` lines -> one ComputeCapability per GPU (first line wins), and the skipped count.

    Blank lines and the header (``index, compute_cap``) are not counted; any other line without a numeric
    index and exactly two cells is.
    """
    caps: dict[int, ComputeCapability] = {}
    skipped = 0
    for line in _lines(text_or_lines):
        stripped = line.strip()
        if not stripped or stripped.replace(" ", "").lower() == "index,compute_cap":
            continue
        parts = stripped.split(",")
        if len(parts) != 2 or not parts[0].strip().isdigit():
            skipped += 1
            continue
        gpu = int(parts[0].strip())
        caps.setdefault(gpu, parse_capability(gpu, parts[1]))
    return sorted(caps.values(), key=lambda cap: cap.gpu), skipped


def _link_cell(a: int, b: int, cell: str) -> GpuLink | None:
    text = _OLD_NAMES.get(cell, cell)
    nv = _NV_CELL.match(text)
    if nv is not None and int(nv.group(1)) > 0:
        return GpuLink(min(a, b), max(a, b), NVLINK, int(nv.group(1)))
    if text in PCIE_PATHS:
        return GpuLink(min(a, b), max(a, b), text)
    return None


def _columns(header: str) -> list[str] | None:
    """The device columns of the header row (GPU0 ... NIC0 ...), or None when the line is no header."""
    tokens = header.split()
    if "CPU" in tokens:
        tokens = tokens[: tokens.index("CPU")]
    if not tokens or _GPU_NAME.match(tokens[0]) is None:
        return None
    return tokens


def parse_topology(text_or_lines: str | Iterable[str]) -> Topology:
    """`nvidia-smi topo -m` output -> the GPU-to-GPU links. Never raises; see the module docstring."""
    columns: list[str] | None = None
    gpus: list[int] = []
    links: dict[tuple[int, int], GpuLink] = {}
    skipped = 0
    for raw in _lines(text_or_lines):
        line = _ANSI.sub("", raw).rstrip("\r\n")
        if not line.strip():
            continue
        if line.strip().startswith("Legend:"):
            break
        if columns is None:
            columns = _columns(line)
            skipped += columns is None  # text before the header: not part of a matrix
            continue
        cells = line.split()
        row = _GPU_NAME.match(cells[0])
        if row is None:
            skipped += cells[0] not in columns  # a NIC row is no link between GPUs; anything else is junk
            continue
        if len(cells) < 1 + len(columns):
            skipped += 1
            continue
        me = int(row.group(1))
        if me in gpus:
            skipped += 1
            continue
        gpus.append(me)
        for name, cell in zip(columns, cells[1 : 1 + len(columns)], strict=True):
            other = _GPU_NAME.match(name)
            if other is None or int(other.group(1)) == me:
                continue
            link = _link_cell(me, int(other.group(1)), cell)
            if link is None:
                skipped += 1
                continue
            links.setdefault((link.a, link.b), link)
    return Topology(tuple(gpus), tuple(sorted(links.values(), key=lambda link: (link.a, link.b))), skipped)


async def _run(host: Host, argv: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None) when the command worked, else (None, why): the tool's message or the host's."""
    try:
        result = await host.run(argv, timeout=_QUERY_TIMEOUT_S)
    except Exception as exc:  # host errors, timeouts, lost connections: a reason, never a raise
        text = str(exc)
        return None, text if text.startswith(f"{host.name}:") else f"{host.name}: {type(exc).__name__}: {text}"
    if result.returncode != 0:
        error = classify_smi_failure(result.returncode, result.stdout, result.stderr)
        message = error.message if error is not None else f"exit code {result.returncode}"
        return None, f"{' '.join(argv)}: {message}"
    return result.stdout, None


async def read_gpu_facts(
    host: Host, gpus: Sequence[int] | None = None, executable: str = "nvidia-smi"
) -> GpuFacts:
    """Compute capability of `gpus` (all when None or empty) and the topology among them, from `host`."""
    (caps_text, caps_error), (topo_text, topo_error) = await asyncio.gather(
        _run(host, compute_cap_argv(gpus, executable)), _run(host, topology_argv(executable))
    )
    caps, skipped = parse_compute_caps(caps_text) if caps_text is not None else ([], 0)
    if caps_text is not None and not caps:
        caps_error = "nvidia-smi printed no compute_cap row"
    topology = parse_topology(topo_text) if topo_text is not None else None
    if topology is not None and gpus:
        wanted = set(gpus)
        topology = Topology(
            tuple(g for g in topology.gpus if g in wanted),
            tuple(link for link in topology.links if link.a in wanted and link.b in wanted),
            topology.skipped,
        )
    return GpuFacts(tuple(caps), topology, caps_error, topo_error, skipped)
