"""The dashboard tests' own fixture: `profile` (the shared ones are in tests/conftest.py)."""

from __future__ import annotations

import pytest

from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from tests.helpers import MakeProfile


@pytest.fixture
def profile(make_profile: MakeProfile) -> Profile:
    """A demo-like profile on a private sim state folder and a free port, with a 0.3 s simulated startup
    (whatever it launched is killed by `make_profile` afterwards)."""
    return load_profile(make_profile(startup_s=0.3))
