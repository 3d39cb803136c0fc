"""Nested JSON is capped at 32 levels wherever it enters (issue 19): `--set`, the palette's value parser and a
profile file say which flag or file and why, never a RecursionError; one such file in the profile folder is
listed as unreadable by `tunedash profiles` and the fleet while the others still work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.fleet import fleet_profiles
from app.core.flags.values import FlagError, lookup_flag, parse_value
from app.core.profiles.loading import apply_overrides, load_profile, resolve_profile
from app.core.profiles.types import ProfileError
from tests.helpers import REPO

DEEP = '{"a":' * 5000 + "1" + "}" * 5000  # far past Python's recursion limit
DEEP_ARRAY = "[" * 5000 + "]" * 5000
JSON_FLAG = "cuda-graph-config"  # an SGLang JSON flag


def _demo_with(value: str) -> str:
    text = (REPO / "profiles" / "demo.toml").read_text()
    return text.replace("[flags]\n", f"[flags]\n{JSON_FLAG} = '{value}'\n", 1)


def test_set_with_deeply_nested_json_names_the_flag() -> None:
    demo = resolve_profile("demo")
    for item in (f"{JSON_FLAG}={DEEP}", f"{JSON_FLAG}={DEEP_ARRAY}", f"{JSON_FLAG}.key={DEEP}"):
        with pytest.raises(ProfileError) as caught:
            apply_overrides(demo, [item], [])
        assert f"--set {JSON_FLAG}" in str(caught.value) and "nested more than 32 levels" in str(caught.value)
        assert len(str(caught.value)) < 400  # the value is quoted short, not echoed whole
    shallow = apply_overrides(demo, [f'{JSON_FLAG}={{"a":{{"b":[1,{{"c":2}}]}}}}'], [])
    assert shallow.flags[JSON_FLAG] == {"a": {"b": [1, {"c": 2}]}}  # a real value still reads


def test_palette_value_parser_refuses_deep_json_in_words() -> None:
    spec = lookup_flag("sglang", JSON_FLAG)
    assert spec is not None
    with pytest.raises(FlagError, match="nested more than 32 levels"):
        parse_value(spec, DEEP)
    assert parse_value(spec, '{"x": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}') == {"x": "[" * 40}  # in a string


def test_profile_file_with_deep_json_names_the_file_and_flag(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(_demo_with(DEEP))
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    assert str(path) in str(caught.value) and f"flags.{JSON_FLAG}" in str(caught.value)
    assert "nested more than 32 levels" in str(caught.value)
    inline = tmp_path / "inline.toml"  # a TOML table nested 40 deep: readable TOML, too deep a flag value
    inline.write_text(_demo_with("{}").replace(f"{JSON_FLAG} = '{{}}'", f"{JSON_FLAG} = " + "{a = " * 40 + "1"
                                                                           + " }" * 40))
    with pytest.raises(ProfileError, match="nested more than 32 levels"):
        load_profile(inline)


@pytest.fixture
def profile_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's profile folder (XDG_CONFIG_HOME) holding one good profile and one with deep JSON."""
    folder = tmp_path / "config" / "tunedash" / "profiles"
    folder.mkdir(parents=True)
    shutil.copy(REPO / "profiles" / "demo.toml", folder / "mine.toml")
    (folder / "bad.toml").write_text(_demo_with(DEEP))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return folder


def test_profiles_lists_the_bad_file_as_unreadable_and_the_others(profile_folder: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(profile_folder.parents[1])}
    listed = subprocess.run([sys.executable, "-m", "app", "profiles", "--json"], capture_output=True, text=True,
                            cwd=REPO, env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert "nested more than 32 levels" in rows["bad"]["error"] and str(profile_folder / "bad.toml") in \
        rows["bad"]["error"]
    assert rows["mine"]["error"] is None and rows["demo"]["error"] is None


def test_fleet_lists_the_bad_file_and_shows_the_others(profile_folder: Path) -> None:
    profiles, broken = fleet_profiles([])
    assert any(p.name == "demo" for p in profiles)
    assert len(broken) == 1 and broken[0].startswith(str(profile_folder / "bad.toml"))
    assert "nested more than 32 levels" in broken[0]
