"""`tunedash log FILE`: a readable table by default, the summary as JSON with `--json`, the event stream with
`--events`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli.main import main as cli_main
from tests.helpers import DATA

LOGS = DATA / "logs"


def run_log(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli_main(["log", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_default_is_a_table_a_person_reads(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_log(capsys, str(LOGS / "sglang_0523_startup.log"))
    assert code == 0
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)  # before: the JSON summary
    lines = out.splitlines()
    assert lines[0].endswith("sglang log, ready 75.0 s after the log's first timestamp")
    assert lines[2].split() == ["phase", "seconds", "GiB", "from"]
    assert "weights 33.06 25.96 backend" in [" ".join(line.split()) for line in lines]
    assert "cuda_graph (target verify) 12.41 0.62 backend" in [" ".join(line.split()) for line in lines]
    assert "KV cache     393,216 tokens, 16.22 GiB" in lines
    assert "weights      25.96 GiB" in lines
    assert any(line.startswith("decode       mean 55.0 tok/s, max 57.9 tok/s over 3") and "accept len 3.19" in line
               for line in lines)
    assert "notices      2" in lines and any("auto_adjusted  Max running requests is reset to 48" in line
                                               for line in lines)
    assert "fatal        none" in lines


def test_a_crash_log_says_not_ready_and_lists_the_fatal_events(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_log(capsys, str(LOGS / "sglang_crash_loading.log"))
    assert code == 0
    assert "not ready: no ready line (fatal events below)" in out.splitlines()[0]
    assert "fatal        2" in out and "oom" in out and "RuntimeError: Not enough memory" in out


def test_json_is_the_summary_and_events_the_stream(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(LOGS / "sglang_0523_startup.log")
    code, out, _ = run_log(capsys, path, "--json")
    assert code == 0
    summary = json.loads(out)  # before: `--json` printed one event per line
    assert summary["ready_seconds"] == 75.0 and summary["kv_cache_tokens"] == 393216
    assert summary["capacity"]["max_running_requests"] == 48
    assert [row["phase"] for row in summary["phases"]][:3] == ["init", "weights", "kv_cache"]
    code, out, _ = run_log(capsys, path, "--events")
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert len(events) > 20 and {"phase", "ready", "decode", "notice"} <= {event["type"] for event in events}


def test_json_and_events_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["log", str(LOGS / "vllm_011.log"), "--json", "--events"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_log_text_cannot_drive_the_terminal(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("[2026-06-02 09:14:05] Max running requests is reset to 48\x1bP+q\x9b2J\x08\x08 for speculative "
                   "decoding. You can override this by explicitly setting --max-running-requests.\n")  # DCS, CSI, BS
    code, out, _ = run_log(capsys, str(log), "--backend", "sglang")
    assert code == 0
    assert "notices      1" in out and not {"\x1b", "\x9b", "\x08"} & set(out)
    assert "reset to 48\N{REPLACEMENT CHARACTER}P+q\N{REPLACEMENT CHARACTER}2J" in out


def test_an_unreadable_log_is_a_clean_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_log(capsys, str(tmp_path / "missing.log"))
    assert code == 2 and "missing.log: cannot read the log" in err
