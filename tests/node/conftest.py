"""The supervisor's jobs run as another account when the tests run as root (CI does)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gfair.node.job_cgroup import AUTO, CgroupTree, locate

from .helpers import reachable_tmp, sdk_on_pythonpath

# pytest's `tmp_path`, but reachable by the jobs' account (see `reachable_tmp`).
tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)
sdk_for_jobs = pytest.fixture(autouse=True)(sdk_on_pythonpath)

# Where job cgroups can be made here (a writable cgroup2 hierarchy), else None.
CGROUPS = locate(AUTO)
needs_cgroups = pytest.mark.skipif(CGROUPS is None, reason="no writable cgroup2 hierarchy here")


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[CgroupTree]:
    """Alice's job cgroups on a test node, swept and removed after the test."""
    assert CGROUPS is not None
    made = CgroupTree.under(CGROUPS, "test", "alice", tmp_path)
    yield made
    made.sweep()
    made.close()
    assert not made.path.parent.exists()
