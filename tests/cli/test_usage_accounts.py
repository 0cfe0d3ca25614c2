"""`gfair usage` with a shares file in force: the tree, each account its users' sums (sshare)."""

from __future__ import annotations

import pytest
from rich.console import Console

from gfair.cli.usage import tree_rows, usage_json, usage_table
from gfair.state.usage import UserUsage

HOUR = 3600.0


def line(user: str, hours: float, share: float) -> UserUsage:
    return UserUsage(
        user=user,
        jobs=2,
        running=1,
        gpu_hours={"v100": hours},
        windows={HOUR: hours / 2},
        decayed_gpu_hours=hours / 4,
        decayed_share=share,
    )


LINES = [line("alice", 4.0, 0.2), line("bob", 8.0, 0.4), line("eve", 8.0, 0.4)]
MEMBERS = {"alice": "lab/vision", "bob": "lab"}
ACCOUNTS = {"lab", "lab/vision"}


def test_accounts_sum_their_users_and_come_before_them() -> None:
    rows = tree_rows(LINES, MEMBERS, ACCOUNTS)
    assert [label for label, _ in rows] == ["lab/", "  vision/", "    alice", "  bob", "eve"]
    lab = rows[0][1]
    assert (lab.jobs, lab.running, lab.gpu_hours, lab.windows) == (
        4,
        2,
        {"v100": 12.0},
        {HOUR: 6.0},
    )
    assert lab.decayed_gpu_hours == pytest.approx(3.0)
    assert lab.decayed_share == pytest.approx(0.6)
    assert rows[1][1].gpu_hours == {"v100": 4.0}
    console = Console(width=140, record=True, force_terminal=False)
    console.print(usage_table(rows, [HOUR], 7 * 24 * HOUR))
    assert "  vision/" in console.export_text()
    assert usage_json(LINES[0], "lab/vision")["account"] == "lab/vision"


def test_without_accounts_the_users_are_listed_as_before() -> None:
    assert [label for label, _ in tree_rows(LINES, {}, set())] == ["alice", "bob", "eve"]
