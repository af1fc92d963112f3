from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# No per-example deadline for any property test: hypothesis' default (200 ms) is a wall-clock
# limit, which a slow or loaded machine (a 2-core CI runner, a first call that imports and
# builds policies) breaks for reasons that have nothing to do with the property.
settings.register_profile("evenserve", deadline=None, print_blob=True)
settings.load_profile("evenserve")


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def profiles_dir() -> Path:
    return ROOT / "profiles"
