"""The /metrics reader's cost: `read_metrics` (its plain-line fast path, prometheus_client's parser for the rest)
against the hand regex it replaced and against prometheus_client's parser on every line, on
tests/data/metrics/vllm_0320_real.txt (the real vLLM's) once, twice and repeated to the 16 MiB body cap.

    python bench/bench_metrics_parse.py [--runs 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from app.core.measure.http_probes import MAX_BODY_BYTES, read_metrics

REPO = Path(__file__).resolve().parents[1]
OLD_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def old_reader(text: str) -> dict[str, float]:
    """The regex reader before prometheus_client (label part `[^}]*`), the peer of this benchmark."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = OLD_LINE.match(line)
        if line.startswith("#") or not match:
            continue
        key = f"{match['name']}{{{match['labels']}}}" if match["labels"] else match["name"]
        values[key] = float(match["value"])
    return values


def parser_only(text: str) -> int:
    """prometheus_client's parser on every sample line (what read_metrics does without its fast path)."""
    count = 0
    for line in text.split("\n"):
        if line and not line.startswith("#"):
            count += sum(len(family.samples) for family in text_string_to_metric_families(line))
    return count


def median_s(read: Callable[[str], object], text: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        read(text)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    base = (REPO / "tests" / "data" / "metrics" / "vllm_0320_real.txt").read_text()
    for label, copies in (("one real exposition", 1), ("typical", 2), ("body cap", MAX_BODY_BYTES // len(base))):
        text = base * copies
        old = median_s(old_reader, text, args.runs)
        new = median_s(read_metrics, text, args.runs)
        parser = median_s(parser_only, text, args.runs)
        print(f"{label} ({len(text) // 1024} KiB): read_metrics {new * 1000:.1f} ms, old regex {old * 1000:.1f} ms "
              f"({new / old:.1f}x), the parser on every line {parser * 1000:.1f} ms ({parser / old:.1f}x) "
              f"(median of {args.runs})")


if __name__ == "__main__":
    main()
