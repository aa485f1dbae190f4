"""Root conftest: applies to tests/ and notebooks/ alike."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The notebooks run whole studies (15-50 s each): they belong to the slow run
    # (python -m pytest -m slow), as the heavy validation tests do.
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)
