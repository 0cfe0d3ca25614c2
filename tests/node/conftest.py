"""The supervisor's jobs run as another account when the tests run as root (CI does)."""

from __future__ import annotations

import pytest

from .helpers import reachable_tmp, sdk_on_pythonpath

# pytest's `tmp_path`, but reachable by the jobs' account (see `reachable_tmp`).
tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)
sdk_for_jobs = pytest.fixture(autouse=True)(sdk_on_pythonpath)
