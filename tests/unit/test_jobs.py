"""Job records: round trip, and group membership that ignores reused PIDs and zombies."""

import pytest

from app.core.hosts.procfs import ProcessInfo
from app.core.server.jobs import JobRecord, members_of


def record() -> JobRecord:
    return JobRecord(
        profile="demo", host="sim", backend="sglang", model="m", port=30000, argv=["python"], flags={},
        pid=100, pgid=100, start_time="5000", log_path="/tmp/x.log", launched_by="a@b", launched_at=1.0, gpus=[0],
    )


def test_round_trip_ignores_unknown_keys():
    text = record().to_json().replace('"backend"', '"future_key": 1, "backend"')
    assert JobRecord.from_json(text) == record()


def test_members_exclude_zombies_and_older_processes():
    procs = [
        ProcessInfo(100, 1, 100, "S", "python", "5000"),
        ProcessInfo(101, 100, 100, "S", "sglang::schedul", "5003"),
        ProcessInfo(102, 100, 100, "Z", "sglang::detoken", "5003"),
        ProcessInfo(103, 1, 100, "S", "reused", "4000"),  # a group id reused by an older process
        ProcessInfo(104, 1, 104, "S", "other", "6000"),
    ]
    assert [p.pid for p in members_of(record(), procs)] == [100, 101]


def test_an_unknown_outcome_reads_as_running_and_the_spelling_is_kept():
    assert '"outcome": "running"' in record().to_json()
    text = record().to_json().replace('"outcome": "running"', '"outcome": "exploded"')
    assert JobRecord.from_json(text).outcome == "running"  # the group stays ours to re-attach to and kill
    assert JobRecord.from_json(text.replace('"exploded"', '"killed"')).outcome == "killed"


def test_a_record_that_is_not_an_object_is_unreadable():
    with pytest.raises(ValueError, match="JSON object"):
        JobRecord.from_json("[1, 2]")
