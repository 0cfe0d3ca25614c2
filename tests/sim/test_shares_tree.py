"""Accounts in a tree, through the simulator: backlogged users under three levels of accounts
each receive their entitlement at every level, and the report says so (docs/simulation.md)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from gfair.cli.main import main
from gfair.core.cluster import parse_cluster_spec
from gfair.core.shares_file import parse_shares
from gfair.core.throughput import ThroughputTable
from gfair.sim.replay import ReplayOptions, replay
from shares_example import EVERYONE, THREE_LEVELS

from .test_fairness import END_S, shares
from .test_report import SCHEMA_PATH
from .workloads import Row, backlog, trace_of

SHARES = THREE_LEVELS
TREE = parse_shares(SHARES)
USERS = list(EVERYONE)  # eve is not in the file: the root's, 1 ticket
# Root: research 3, prod 1, eve 1 -> 60%, 20%, 20%; research: vision 1/3, nlp 2/3 -> 20%, 40%;
# vision: alice 1/4, dave 3/4 -> 5%, 15%.
ENTITLED = {"alice": 0.05, "dave": 0.15, "bob": 0.40, "carol": 0.20, "eve": 0.20}


def test_backlogged_users_under_three_levels_get_their_share_at_every_level(
    throughput: ThroughputTable,
) -> None:
    trace = backlog(USERS, 40, sizes=(1, 2, 1))
    measured = shares(trace, "v100:4x8", throughput, shares=TREE)
    for user, expected in ENTITLED.items():
        assert measured[user].entitled_share == pytest.approx(expected)
        assert measured[user].received_share == pytest.approx(expected, abs=0.02), user
    vision = measured["alice"].received_share + measured["dave"].received_share
    assert vision == pytest.approx(0.20, abs=0.02)
    assert vision + measured["bob"].received_share == pytest.approx(0.60, abs=0.02)


def test_the_report_gives_each_account_and_the_error_at_each_level(
    throughput: ThroughputTable,
) -> None:
    trace = backlog(USERS, 40, sizes=(1, 2, 1))
    cluster = parse_cluster_spec("v100:4x8")
    report = replay(trace, cluster, throughput, ReplayOptions(until_s=END_S, shares=TREE)).report
    entitled = {path: a.entitled_share for path, a in report.accounts.items()}
    assert entitled == pytest.approx(
        {"research": 0.60, "research/vision": 0.20, "research/nlp": 0.40, "prod": 0.20}
    )
    assert {path: a.level for path, a in report.accounts.items()} == {
        "research": 1,
        "research/vision": 2,
        "research/nlp": 2,
        "prod": 1,
    }
    assert report.users["alice"].account == "research/vision"
    assert report.users["eve"].account == ""
    assert list(report.share_error_by_level) == ["1", "2", "3"]
    # Level 3 is alice's and dave's, level 2 vision's, nlp's and bob's, level 1 the rest.
    for level, members in {
        "3": [report.users["alice"], report.users["dave"]],
        "2": [report.accounts["research/vision"], report.accounts["research/nlp"]],
    }.items():
        worst = max(abs(m.received_share - m.entitled_share) for m in members)
        assert report.share_error_by_level[level] >= worst
    assert max(report.share_error_by_level.values()) < 0.02


def test_without_a_tree_the_report_has_no_accounts(throughput: ThroughputTable) -> None:
    trace = backlog(["a", "b"], 4)
    report = replay(trace, parse_cluster_spec("v100:1x4"), throughput, ReplayOptions()).report
    assert report.accounts == {} and report.share_error_by_level == {}
    assert {user.account for user in report.users.values()} == {""}


def test_simulate_shares_prints_the_accounts_and_refuses_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "submit_time_s,user,gpus,duration_s\n0,alice,1,600\n0,carol,2,600\n0,eve,1,300\n"
    )
    good, bad, report = tmp_path / "shares.toml", tmp_path / "bad.toml", tmp_path / "r.json"
    good.write_text(SHARES)
    bad.write_text('[accounts."research/vision"]\ntickets = 1\n')
    args = ["simulate", "--trace", str(trace), "--cluster", "v100:1x4", "--shares"]
    assert main([*args, str(good), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "accounts" in out and "vision" in out and "largest share error per level" in out
    data = json.loads(report.read_text())
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
    assert set(data["accounts"]) == set(TREE.accounts)
    assert main([*args, str(bad)]) == 2
    error = capsys.readouterr().err
    assert f"{bad}:1: accounts.\"research/vision\": unknown parent account 'research'" in error


def test_a_flat_file_replays_exactly_as_the_same_tickets(throughput: ThroughputTable) -> None:
    trace = trace_of(
        [
            Row(0, "ann", 1, 9000, "ResNet-50 (batch size 32)"),
            Row(0, "ann", 4, 6000, "ResNet-50 (batch size 32)"),
            Row(10, "bob", 2, 12000, "Recommendation (batch size 8192)"),
            Row(20, "bob", 1, 3000),
            Row(30, "cat", 4, 2000, "A3C"),
            Row(40, "cat", 2, 2000),
        ]
    )
    cluster = parse_cluster_spec("v100:1x4,k80:2x4")
    flat = ReplayOptions(tickets={"ann": 3.0, "bob": 0.5})
    tree = ReplayOptions(
        shares=parse_shares("[users.ann]\ntickets = 3\n[users.bob]\ntickets = 0.5")
    )
    before = replay(trace, cluster, throughput, flat)
    after = replay(trace, cluster, throughput, tree)
    assert before.result.trades > 0  # the trading path is exercised too
    assert after.report.users == before.report.users
    assert after.report.jobs == before.report.jobs
    assert after.report.summary == before.report.summary
