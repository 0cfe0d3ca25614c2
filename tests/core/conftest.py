"""Every machine the core tests make checks its index after every input (`checked_machines`)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _checked(checked_machines: None) -> None:
    pass
