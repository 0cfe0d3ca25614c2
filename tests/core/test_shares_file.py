"""The shares file: what it places where, and every refusal names the line and the field."""

from __future__ import annotations

import pytest

from gfair.core.shares_file import (
    SharesFileError,
    changes,
    parse_shares,
    render_shares,
    with_tickets,
)
from gfair.core.shares_tree import ROOT, ShareTree

ISSUE_EXAMPLE = """\
[accounts.research]
tickets = 3
[accounts."research/vision"]
tickets = 1
[accounts."research/nlp"]
tickets = 2
[accounts.prod]
tickets = 1
[users.alice]
account = "research/vision"
tickets = 1
[users.carol]
account = "prod"
tickets = 1
"""


def test_the_issues_example_reads_into_its_tree() -> None:
    tree = parse_shares(ISSUE_EXAMPLE)
    assert tree.accounts == {
        "research": 3.0,
        "research/vision": 1.0,
        "research/nlp": 2.0,
        "prod": 1.0,
    }
    assert tree.members == {"alice": "research/vision", "carol": "prod"}
    assert tree.account_of("stranger") == ROOT
    assert tree.tickets_of("alice", 5.0) == 1.0
    assert tree.tickets_of("stranger", 5.0) == 5.0


def test_tickets_default_to_one_and_a_user_without_account_is_at_the_root() -> None:
    tree = parse_shares("fairness = 'instantaneous'\n[accounts.a]\n[users.u]\n")
    assert tree.accounts == {"a": 1.0}
    assert tree.account_of("u") == ROOT and tree.user_tickets == {"u": 1.0}


def test_no_file_content_is_a_flat_tree() -> None:
    assert parse_shares("").flat
    assert parse_shares("").plain and not parse_shares("").decayed


@pytest.mark.parametrize(
    ("half_life", "seconds"),
    [
        ("'90s'", 90.0),
        ("'90m'", 5400.0),
        ("' 12h '", 43_200.0),
        ("'7d'", 604_800.0),
        ("'2w'", 1_209_600.0),
        ("'1.5h'", 5400.0),
        ("'600'", 600.0),
        ("600", 600.0),
        ("2.5", 2.5),
    ],
)
def test_the_decayed_mode_reads_its_half_life_with_units(half_life: str, seconds: float) -> None:
    tree = parse_shares(f"fairness = 'decayed'\nhalf_life = {half_life}\n[users.u]\n")
    assert (tree.fairness, tree.half_life_s) == ("decayed", seconds)
    assert tree.decayed and tree.flat and not tree.plain
    assert parse_shares(render_shares(tree)) == tree


def test_the_mode_defaults_to_instantaneous_and_the_half_life_to_seven_days() -> None:
    tree = parse_shares(ISSUE_EXAMPLE)
    assert (tree.fairness, tree.half_life_s, tree.decayed) == ("instantaneous", None, False)
    decayed = parse_shares("fairness = 'decayed'\n" + ISSUE_EXAMPLE)
    assert decayed.half_life_s == 7 * 86_400.0
    assert (decayed.accounts, decayed.members) == (tree.accounts, tree.members)
    with pytest.raises(ValueError, match="half_life_s must be"):
        ShareTree(fairness="decayed")
    with pytest.raises(ValueError, match="instantaneous has none"):
        ShareTree(half_life_s=60.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[accounts.a\ntickets = 1\n", r"f\.toml: not valid TOML: .*line 1"),
        (
            "[users.alice]\naccount = 'a'\n[accounts.a]\n[users.alice]\naccount = 'b'\n",
            r"f\.toml: not valid TOML: .*line 4",
        ),
        ("[accounts.a]\n[accounts.'a/b/c']\n", r"f\.toml:2: accounts\.\"a/b/c\": unknown parent"),
        ("[accounts.a]\n[accounts.'a/../a']\n", r"f\.toml:2: .*not '\.\.'"),
        ("[accounts.'a//b']\n", r"f\.toml:1: .*not ''"),
        ("[accounts.'/a']\n", r"f\.toml:1: .*not ''"),
        ("[accounts.a]\ntickets = 0\n", r"f\.toml:1: accounts\.a: tickets: .*not 0\.0"),
        ("[accounts.a]\ntickets = -2\n", r"f\.toml:1: accounts\.a: tickets: .*not -2\.0"),
        ("[accounts.a]\ntickets = 1e7\n", r"f\.toml:1: accounts\.a: tickets: .*1e\+06"),
        ("[accounts.a]\ntickets = nan\n", r"f\.toml:1: accounts\.a: tickets: .*nan"),
        ("[accounts.a]\ntickets = true\n", r"f\.toml:1: accounts\.a: tickets: expected a num"),
        ("\n[users.bob]\ntickets = '2'\n", r"f\.toml:2: users\.bob: tickets: expected a number"),
        ("[users.bob]\ntickets = 0\n", r"f\.toml:1: users\.bob: tickets"),
        ("[users.bob]\naccount = 'nowhere'\n", r"f\.toml:1: users\.bob: account: unknown accou"),
        ("[users.bob]\naccount = 3\n", r"f\.toml:1: users\.bob: account: expected a string"),
        ("[accounts.a]\nticket = 3\n", r"f\.toml:1: accounts\.a: unknown field 'ticket'"),
        ("[users.'b c']\n", r"f\.toml:1: users\.\"b c\": a user's name"),
        ("users = 3\n", r"f\.toml: users: expected tables"),
        ("accounts.a = 3\n", r"f\.toml: accounts\.a: expected a table"),
        ("tickets = 3\n", r"f\.toml: unknown key 'tickets' at the top"),
        ("fairness = 'fair'\n", r"f\.toml:1: fairness: .*one of instantaneous, decayed"),
        ("\nhalf_life = '1h'\n", r"f\.toml:2: half_life: .*add fairness = \"decayed\""),
        (
            "fairness = 'instantaneous'\nhalf_life = '1h'\n",
            r"f\.toml:2: half_life: a half-life is the decayed mode's",
        ),
        ("fairness = 'decayed'\nhalf_life = '7y'\n", r"f\.toml:2: half_life: .*units s, m, h"),
        ("fairness = 'decayed'\nhalf_life = 'h'\n", r"f\.toml:2: half_life: .*not 'h'"),
        ("fairness = 'decayed'\nhalf_life = '-2h'\n", r"f\.toml:2: half_life: .*> 0, not '-2h'"),
        ("fairness = 'decayed'\nhalf_life = 0\n", r"f\.toml:2: half_life: .*> 0, not 0"),
        ("fairness = 'decayed'\nhalf_life = 'inf'\n", r"f\.toml:2: half_life: .*finite"),
        ("fairness = 'decayed'\nhalf_life = true\n", r"f\.toml:2: half_life: .*not True"),
        ("fairness = 'decayed'\nhalf_life = [1]\n", r"f\.toml:2: half_life: .*not \[1\]"),
    ],
)
def test_bad_input_is_refused_naming_where(text: str, message: str) -> None:
    with pytest.raises(SharesFileError, match=message):
        parse_shares(text, "f.toml")


def test_a_rendered_tree_reads_back_as_the_same_tree() -> None:
    tree = parse_shares(ISSUE_EXAMPLE + "[users.bob]\ntickets = 0.25\n")
    assert parse_shares(render_shares(tree)) == tree
    assert render_shares(parse_shares("")) == ""


def test_changes_say_what_differs_line_by_line() -> None:
    before = parse_shares(ISSUE_EXAMPLE)
    after = with_tickets(with_tickets(before, "research/vision", 2), "dave", 4)
    after = ShareTree(
        {p: t for p, t in after.accounts.items() if p != "research/nlp"},
        {**after.members, "carol": ""},
        after.user_tickets,
    )
    assert changes(before, after) == [
        "account research/nlp removed (it had 2 tickets)",
        "account research/vision: tickets 1 -> 2",
        "user carol moved from prod to the root",
        "user dave added to the root with 4 tickets",
    ]
    assert changes(after, after) == []
    decayed = parse_shares("fairness = 'decayed'\nhalf_life = '36h'\n" + ISSUE_EXAMPLE)
    assert changes(before, decayed) == ["fairness instantaneous -> decayed (half-life 36h)"]


def test_with_tickets_names_what_it_cannot_set() -> None:
    tree = parse_shares(ISSUE_EXAMPLE)
    assert with_tickets(tree, "alice", 5).user_tickets["alice"] == 5
    assert with_tickets(tree, "research", 5).accounts["research"] == 5
    decayed = parse_shares("fairness = 'decayed'\nhalf_life = '1h'\n" + ISSUE_EXAMPLE)
    for name in ("alice", "research", "newcomer"):
        assert with_tickets(decayed, name, 2).half_life_s == 3600.0
    with pytest.raises(SharesFileError, match="neither an account of the tree nor a user"):
        with_tickets(tree, "research/nowhere", 1)
    with pytest.raises(SharesFileError, match="alice: tickets must be"):
        with_tickets(tree, "alice", 0)
