"""docs/cli.md names every command and subcommand of the real `gfair` argparse tree, and no page
of the docs names a `gfair` command that does not exist."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gfair.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
CLI_REFERENCE = ROOT / "docs" / "cli.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WORD = re.compile(r"[a-z][a-z0-9-]*")

Tree = dict[str, "Tree"]


def command_tree(parser: argparse.ArgumentParser) -> Tree:
    """Each command's subcommands, as argparse holds them (a leaf maps to {})."""
    tree: Tree = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                tree[name] = command_tree(sub)
    return tree


def paths(tree: Tree, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for name, below in tree.items():
        found.add((*prefix, name))
        found |= paths(below, (*prefix, name))
    return found


def invocations(text: str) -> list[str]:
    """What follows `gfair` in every inline code span that starts with it, and in every command
    of a fenced shell block that runs it (`gfair ...`, `.venv/bin/gfair ...`)."""
    found = [m.group(1) for m in re.finditer(r"`gfair ([^`]*)`", text)]
    for block in re.findall(r"```(?:sh|bash|console)\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            code = line.split(" #")[0]
            for part in re.split(r"&&|;|\||\$\(", code):
                words = part.split()
                if words and re.fullmatch(r"(\S*/)?gfair", words[0]):
                    found.append(" ".join(words[1:]))
    return found


def named_path(invocation: str, tree: Tree) -> tuple[str, ...]:
    """The command path an invocation names; AssertionError where a word is not a command.

    The first word must be a command; after a command with subcommands, a lowercase word must
    be one of them. Options, placeholders (NAME, USER/JOB) and a leaf's arguments end it."""
    path: tuple[str, ...] = ()
    below = tree
    for word in invocation.replace("\\|", "|").split():
        if not below or not WORD.fullmatch(word):
            break
        assert word in below, f"`gfair {invocation}`: no command `{' '.join((*path, word))}`"
        path = (*path, word)
        below = below[word]
    return path


@pytest.fixture(scope="module")
def tree() -> Tree:
    return command_tree(build_parser(complete=True))


def test_the_tree_is_read_whole(tree: Tree) -> None:
    assert {"up", "submit", "why"} <= tree.keys()
    assert ("nodes", "uncordon") in paths(tree) and ("tenants", "render") in paths(tree)


def test_docs_cli_names_every_command_and_subcommand(tree: Tree) -> None:
    named = set()
    for invocation in invocations(CLI_REFERENCE.read_text()):
        path = named_path(invocation, tree)
        named |= {path[:n] for n in range(1, len(path) + 1)}  # `tenants render` names `tenants`
    missing = sorted(" ".join(p) for p in paths(tree) - named)
    assert not missing, f"docs/cli.md does not name: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_a_command_that_does_not_exist(page: Path, tree: Tree) -> None:
    for invocation in invocations(page.read_text()):
        named_path(invocation, tree)


def test_a_made_up_command_is_caught(tree: Tree) -> None:
    with pytest.raises(AssertionError, match="no command `nodes drain`"):
        named_path("nodes drain NODE", tree)
    with pytest.raises(AssertionError, match="no command `launch`"):
        named_path("launch --gpus 2", tree)
