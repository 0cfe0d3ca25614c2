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
        ("fairness = 'decayed'\n", r"f\.toml:1: fairness: .*not built into the schedulers yet"),
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


def test_with_tickets_names_what_it_cannot_set() -> None:
    tree = parse_shares(ISSUE_EXAMPLE)
    assert with_tickets(tree, "alice", 5).user_tickets["alice"] == 5
    assert with_tickets(tree, "research", 5).accounts["research"] == 5
    with pytest.raises(SharesFileError, match="neither an account of the tree nor a user"):
        with_tickets(tree, "research/nowhere", 1)
    with pytest.raises(SharesFileError, match="alice: tickets must be"):
        with_tickets(tree, "alice", 0)
