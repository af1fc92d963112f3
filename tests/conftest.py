from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent

# No per-example deadline for any property test and no "too slow" health check: both are
# wall-clock limits (hypothesis' default deadline is 200 ms per example), which a slow or loaded
# machine (a 2-core CI runner, a first call that imports and builds policies) breaks for
# reasons that have nothing to do with the property.
settings.register_profile(
    "evenserve", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("evenserve")


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def profiles_dir() -> Path:
    return ROOT / "profiles"
