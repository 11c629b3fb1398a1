"""Unit tests: pure code, no servers."""
from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so these tests run whether or not the root configuration lists
    # the marker yet (an unknown marker is a warning, and warnings are errors).
    config.addinivalue_line("markers", "unit: pure code, no servers")
