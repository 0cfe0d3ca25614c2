from __future__ import annotations

from pathlib import Path

import pytest

from gfair.events import EventData
from gfair.events.schema import contract_types

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMAS_DIR = REPO_ROOT / "schemas"

CONTRACT = contract_types()


def by_type() -> list[type[EventData]]:
    return list(CONTRACT.values())


@pytest.fixture(params=list(CONTRACT), ids=list(CONTRACT))
def model(request: pytest.FixtureRequest) -> type[EventData]:
    return CONTRACT[request.param]
