"""A Slurm profile's host spec and [slurm] table: what reads, what salloc gets, and every bad value named."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.hosts.slurm_facts import SlurmFacts, granted_job, parse_job_line, parse_left, trouble
from app.core.hosts.slurm_request import SlurmRequest, slurm_login
from app.core.profiles.loading import load_profile
from app.core.profiles.types import ProfileError

BASE = 'backend = "sglang"\nmodel = "m"\n'


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "p.toml"
    path.write_text(BASE + text)
    return load_profile(path)


def test_a_request_becomes_the_salloc_argv(tmp_path: Path) -> None:
    profile = _load(tmp_path, 'host = "slurm:local"\n[slurm]\npartition = "gpu"\ngpus = 2\ntime = "02:00:00"\n'
                    'account = "proj42"\nsalloc_args = ["--qos=short"]\n')
    assert profile.slurm == SlurmRequest("local", None, "gpu", 2, "02:00:00", "proj42", ("--qos=short",))
    assert profile.slurm.salloc_argv() == ["salloc", "--no-shell", "-N1", "-J", "tunedash", "-p", "gpu", "--gpus=2",
                                           "--time=02:00:00", "-A", "proj42", "--qos=short"]


def test_login_specs() -> None:
    assert slurm_login("slurm:local") == "local"
    assert slurm_login("slurm://login1") == "login1"
    assert slurm_login("slurm://me@login.example:2222") == "ssh://me@login.example:2222"
    assert slurm_login("ssh://x") is None
    for bad in ("slurm:", "slurm://a b", "slurm://x;rm -rf ~", "slurm://h:99999"):
        with pytest.raises(ValueError, match="slurm"):
            slurm_login(bad)


def test_every_bad_value_is_named(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as caught:
        _load(tmp_path, 'host = "slurm:local"\n[slurm]\njob = -3\ngpus = "two"\ntime = "soon"\npartition = "a;b"\n'
              'salloc_args = ["sh", "-c"]\nnodes = 2\n')
    text = str(caught.value)
    for key in ("slurm.job", "slurm.gpus", "slurm.time", "slurm.partition", "slurm.salloc_args", "slurm.nodes"):
        assert key in text, text
    assert str(tmp_path / "p.toml") in text


def test_a_job_and_a_request_together_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="attaching to a job takes no allocation request"):
        _load(tmp_path, 'host = "slurm:local"\n[slurm]\njob = 7\ngpus = 1\n')


def test_a_slurm_table_elsewhere_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="only a host = \"slurm:local\""):
        _load(tmp_path, 'host = "local"\n[slurm]\njob = 7\n')
    with pytest.raises(ProfileError, match="slurm://LOGIN"):
        _load(tmp_path, 'host = "slurm:nowhere"\n')


def test_scheduler_output_is_read() -> None:
    assert parse_left("1-02:03:04") == 93784.0 and parse_left("9:59") == 599.0 and parse_left("UNLIMITED") is None
    assert parse_job_line("RUNNING|29:58|vm|None\n") == ("RUNNING", 1798.0, "vm", "None")
    assert parse_job_line("") is None
    assert granted_job("salloc: Granted job allocation 42\n") == 42
    assert trouble("srun: error: Unable to contact slurm controller (connect failure)") == "unreachable"
    assert trouble("srun: error: Unable to confirm allocation for job 9: Invalid job id specified") == "gone"
    assert SlurmFacts(9, "vm", "TIMEOUT").ended and not SlurmFacts(9, "vm", "RUNNING").ended
    assert SlurmFacts(9, "vm", "RUNNING", "", 61.0).header() == "slurm 9 on vm: RUNNING, 1:01 left"
