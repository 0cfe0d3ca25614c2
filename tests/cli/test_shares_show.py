"""`gfair shares show`: the tree's rows from the auction's record and split-stride's usage, and
the table they make (the command itself reads both as `gfair users` does); `apply` and `set`
refuse bad input before connecting (their effect: tests/services/test_trading_auction.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from gfair.cli.main import main
from gfair.cli.shares import _source, tree_rows, tree_table
from gfair.client.views import PoolUsage, UserSummary, UsersView
from gfair.state.share_record import AccountShare, SharesRecord

NOW = datetime(2026, 11, 26, tzinfo=UTC)
CAPACITY = {"v100": 8, "k80": 8}


def user(name: str, tickets: float, fair: float, entitled: float, received: float) -> UserSummary:
    pools = {
        pool: PoolUsage(pool, fair=fair / 2, entitled=entitled / 2, gpu_seconds=0.0, received=r)
        for pool, r in (("v100", received * 0.75), ("k80", received * 0.25))
    }
    return UserSummary(user=name, tickets=tickets, jobs=1, demand=16, pools=pools)


VIEW = UsersView(
    users=[
        user("alice", 1, 2.0, 2.5, 2.25),
        user("dave", 3, 6.0, 5.5, 6.0),
        user("bob", 1, 4.0, 4.0, 3.5),
        user("eve", 1, 4.0, 4.0, 4.25),
    ],
    capacity=CAPACITY,
)
RECORD = SharesRecord(
    revision=3,
    computed_at=NOW,
    min_seller_gain=0.1,
    capacity=CAPACITY,
    accounts={
        "research": AccountShare(tickets=3, fair=12.0),
        "research/vision": AccountShare(tickets=1, fair=8.0),
        "research/nlp": AccountShare(tickets=2, fair=4.0),
        "prod": AccountShare(tickets=1, fair=0.0),
    },
    members={"alice": "research/vision", "dave": "research/vision", "bob": "research/nlp"},
)


def test_every_level_sums_its_users_depth_first() -> None:
    rows = tree_rows(VIEW, RECORD)
    assert [(r.kind, r.account, r.name, r.level) for r in rows] == [
        ("root", "", "(cluster)", 0),
        ("account", "prod", "prod", 1),
        ("account", "research", "research", 1),
        ("account", "research/nlp", "nlp", 2),
        ("user", "research/nlp", "bob", 3),
        ("account", "research/vision", "vision", 2),
        ("user", "research/vision", "alice", 3),
        ("user", "research/vision", "dave", 3),
        ("user", "", "eve", 1),
    ]
    by = {(r.kind, r.name): r for r in rows}
    assert (by["account", "vision"].fair, by["account", "vision"].entitled) == (8.0, 8.0)
    assert by["account", "vision"].received == pytest.approx(8.25)
    assert by["account", "research"].received == pytest.approx(11.75)
    assert by["account", "research"].tickets == 3
    assert (by["account", "prod"].entitled, by["account", "prod"].received) == (0.0, 0.0)
    assert by["root", "(cluster)"].entitled == pytest.approx(16.0)
    assert by["root", "(cluster)"].received == pytest.approx(16.0)
    console = Console(width=100, record=True, force_terminal=False)
    console.print(tree_table(rows, 16))
    text = console.export_text()
    assert "    alice" in text and "  vision/" in text and "51.6%" in text  # vision's 8.25 of 16


def test_without_a_tree_or_with_a_tenants_cut_users_sit_at_the_root() -> None:
    flat = tree_rows(VIEW, None)
    assert [(r.kind, r.level) for r in flat] == [("root", 0)] + [("user", 1)] * 4
    cut = RECORD.model_copy(update={"accounts": {}, "members": {"alice": "research/vision"}})
    assert {r.account for r in tree_rows(VIEW, cut)} == {""}


def test_show_is_the_only_action() -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["shares"])
    assert exit_.value.code == 2


def test_apply_and_set_refuse_bad_input_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "shares.toml"
    bad.write_text("[accounts.lab]\n[users.ann]\naccount = 'labs'\n")
    unreachable = ["--nats", "nats://127.0.0.1:1"]
    assert main(["shares", "apply", str(bad), *unreachable]) == 2
    assert "shares.toml:2: users.ann: account: unknown account 'labs'" in capsys.readouterr().err
    assert main(["shares", "set", "lab=0", *unreachable]) == 2
    assert "'lab=0': tickets must be" in capsys.readouterr().err
    assert main(["shares", "set", "lab", *unreachable]) == 2
    assert "expected NAME=TICKETS" in capsys.readouterr().err


def test_the_caption_says_where_the_tree_comes_from() -> None:
    assert _source(None) == "no shares file: every user at the root"
    assert _source(RECORD.model_copy(update={"shares": "[accounts.prod]\n"})) == (
        "the services' shares file; fairness instantaneous"
    )
    decayed = 'fairness = "decayed"\nhalf_life = "36h"\n[accounts.prod]\n'
    changed = RECORD.model_copy(
        update={"shares": decayed, "shares_changed_by": "ops", "shares_changed_at": NOW}
    )
    assert _source(changed) == (
        "changed by ops at 2026-11-26T00:00:00+00:00; fairness decayed (half-life 36h)"
    )
