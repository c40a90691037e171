"""Shared fixtures for every test package."""

from __future__ import annotations

import pytest
from synthetic import make_plant, make_profile

from gpugov.plant import PerformanceProfile, ServingPlant


@pytest.fixture
def profile() -> PerformanceProfile:
    return make_profile()


@pytest.fixture
def plant() -> ServingPlant:
    return make_plant()
