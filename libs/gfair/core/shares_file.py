"""The shares file (TOML) into a `ShareTree` (docs/configuration.md, "Shares file").

    [accounts.research]
    tickets = 3
    [accounts."research/vision"]
    tickets = 1
    [users.alice]
    account = "research/vision"
    tickets = 1

Two optional keys at the top, before the tables, choose the fairness mode: ``fairness =
"instantaneous"`` (the default: tickets alone) or ``"decayed"``, with ``half_life`` the decayed
mode's half-life (docs/design.md §1.1): a string of a number and a unit, ``s``, ``m``, ``h``,
``d`` or ``w`` (``"90m"``, ``"7d"``), or a bare number of seconds; 7 days when omitted.

An account's parent is its path less the last segment and must be defined too; a user's
``account`` must be defined (omitted: the root). ``tickets`` defaults to 1 for both. Paths name
parents, so a tree read from a file has no cycles; the segments ``.`` and ``..``, which would
let a path lead back to itself, are not names and are refused. Every error is a
`SharesFileError` naming the file, the line of the offending table where the text has one, and
the field.

The text is parsed here, never read: the callers read the file (the core does no I/O).
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from typing import Any, Final

from gfair.core.shares_tree import (
    DECAYED,
    FAIRNESS,
    INSTANTANEOUS,
    NAME,
    ROOT,
    ShareTree,
    check_path,
    parent_of,
)
from gfair.core.tickets import check_tickets

_TOP: Final = ("fairness", "half_life", "accounts", "users")
DEFAULT_HALF_LIFE: Final = "7d"  # Slurm's PriorityDecayHalfLife default
# A half-life's units, largest first (`_duration_text` writes the largest that is exact).
_UNITS: Final = {"w": 7 * 86_400.0, "d": 86_400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_ACCOUNT_FIELDS: Final = ("tickets",)
_USER_FIELDS: Final = ("account", "tickets")
DEFAULT_TICKETS: Final = 1.0


class SharesFileError(ValueError):
    """A shares file that cannot be used; the message names where and what."""


def parse_shares(text: str, source: str = "shares file") -> ShareTree:
    """The tree `text` describes, or `SharesFileError` (module doc)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SharesFileError(f"{source}: not valid TOML: {error}") from None
    where = _Where(text, source)
    for key in data:
        if key not in _TOP:
            raise SharesFileError(
                f"{source}: unknown key {key!r} at the top; expected one of {', '.join(_TOP)}"
            )
    fairness = data.get("fairness", INSTANTANEOUS)
    if fairness not in FAIRNESS:
        raise SharesFileError(
            f"{where.key('fairness')}: fairness = {fairness!r}: one of {', '.join(FAIRNESS)}"
        )
    half_life_s: float | None = None
    if fairness == DECAYED:
        half_life_s = _half_life(data.get("half_life", DEFAULT_HALF_LIFE), where.key("half_life"))
    elif "half_life" in data:
        raise SharesFileError(
            f"{where.key('half_life')}: a half-life is the decayed mode's; "
            'add fairness = "decayed" or remove it'
        )
    accounts = _table(data, "accounts", source)
    users = _table(data, "users", source)
    tickets: dict[str, float] = {}
    for path, fields in accounts.items():
        at = where.table("accounts", path)
        _fields(fields, _ACCOUNT_FIELDS, at)
        try:
            check_path(path)
        except ValueError as error:
            raise SharesFileError(f"{at}: {error}") from None
        tickets[path] = _tickets(fields, at)
    for path in accounts:
        parent = parent_of(path)
        if parent != ROOT and parent not in accounts:
            raise SharesFileError(
                f"{where.table('accounts', path)}: unknown parent account {parent!r} "
                f"(define [accounts.{_quoted(parent)}])"
            )
    members: dict[str, str] = {}
    user_tickets: dict[str, float] = {}
    for user, fields in users.items():
        at = where.table("users", user)
        _fields(fields, _USER_FIELDS, at)
        if not NAME.fullmatch(user):
            raise SharesFileError(f"{at}: a user's name is 1 to 64 of A-Z a-z 0-9 _ -")
        account = fields.get("account", ROOT)
        if not isinstance(account, str):
            raise SharesFileError(f"{at}: account: expected a string, not {account!r}")
        if account != ROOT and account not in accounts:
            raise SharesFileError(f"{at}: account: unknown account {account!r}")
        members[user] = account
        user_tickets[user] = _tickets(fields, at)
    return ShareTree(tickets, members, user_tickets, fairness, half_life_s)


def _half_life(value: object, at: str) -> float:
    """Seconds of a ``half_life`` (module doc), or `SharesFileError` naming the value."""
    expected = 'expected a duration such as "90m", "12h" or "7d" (units s, m, h, d, w), or seconds'
    if isinstance(value, bool):
        raise SharesFileError(f"{at}: {expected}, not {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        scale = _UNITS.get(text[-1:])
        try:
            seconds = float(text[:-1] if scale is not None else text) * (scale or 1.0)
        except ValueError:
            raise SharesFileError(f"{at}: {expected}, not {value!r}") from None
    else:
        raise SharesFileError(f"{at}: {expected}, not {value!r}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise SharesFileError(f"{at}: a half-life must be a finite duration > 0, not {value!r}")
    return seconds


def _duration_text(seconds: float) -> str:
    """`seconds` in the largest unit that says it exactly (``"7d"``), else in seconds."""
    for unit, scale in _UNITS.items():
        if seconds >= scale and seconds % scale == 0:
            return f"{int(seconds // scale)}{unit}"
    return f"{seconds!r}s"


class _Where:
    """Names a place in the file: its line where a table header or key is found in the text."""

    def __init__(self, text: str, source: str) -> None:
        self.lines = text.splitlines()
        self.source = source

    def table(self, kind: str, name: str) -> str:
        name_form = "|".join(re.escape(form) for form in (name, f'"{name}"', f"'{name}'"))
        header = re.compile(rf"\s*\[\s*{kind}\s*\.\s*(?:{name_form})\s*\]")
        return self._at(header, f"{kind}.{_quoted(name)}")

    def key(self, key: str) -> str:
        return self._at(re.compile(rf"\s*{re.escape(key)}\s*="), key)

    def _at(self, pattern: re.Pattern[str], field: str) -> str:
        for number, line in enumerate(self.lines, start=1):
            if pattern.match(line):
                return f"{self.source}:{number}: {field}"
        return f"{self.source}: {field}"


def _table(data: dict[str, Any], key: str, source: str) -> dict[str, dict[str, Any]]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise SharesFileError(f"{source}: {key}: expected tables [{key}.NAME]")
    for name, fields in table.items():
        if not isinstance(fields, dict):
            raise SharesFileError(
                f"{source}: {key}.{_quoted(name)}: expected a table [{key}.{_quoted(name)}]"
            )
    return table


def _fields(fields: dict[str, Any], known: tuple[str, ...], at: str) -> None:
    for key in fields:
        if key not in known:
            raise SharesFileError(f"{at}: unknown field {key!r}; expected {', '.join(known)}")


def _tickets(fields: dict[str, Any], at: str) -> float:
    value = fields.get("tickets", DEFAULT_TICKETS)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SharesFileError(f"{at}: tickets: expected a number, not {value!r}")
    try:
        return check_tickets("tickets", float(value))
    except (ValueError, OverflowError) as error:
        raise SharesFileError(f"{at}: {error}") from None


def _quoted(name: str) -> str:
    return name if NAME.fullmatch(name) else f'"{name}"'


def render_shares(tree: ShareTree) -> str:
    """`tree` as a shares file that `parse_shares` reads back into the same tree: accounts by
    path (a parent before its children), then users, each with its tickets; the fairness mode
    first when it is the decayed one."""
    lines: list[str] = []
    if tree.decayed and tree.half_life_s is not None:
        lines += [f'fairness = "{DECAYED}"', f'half_life = "{_duration_text(tree.half_life_s)}"']
    for path in sorted(tree.accounts):
        lines += [f"[accounts.{_quoted(path)}]", f"tickets = {tree.accounts[path]!r}"]
    for user in sorted(tree.members):
        lines.append(f"[users.{user}]")
        if tree.members[user] != ROOT:
            lines.append(f'account = "{tree.members[user]}"')
        lines.append(f"tickets = {tree.user_tickets[user]!r}")
    return "\n".join(lines) + "\n" if lines else ""


def changes(old: ShareTree, new: ShareTree) -> list[str]:
    """What differs from `old` to `new`, one line per account or user (for the audit trail)."""
    said: list[str] = []
    if (old.fairness, old.half_life_s) != (new.fairness, new.half_life_s):
        said.append(f"fairness {describe_mode(old)} -> {describe_mode(new)}")
    for path in sorted(old.accounts.keys() | new.accounts.keys()):
        before, after = old.accounts.get(path), new.accounts.get(path)
        if before is None:
            said.append(f"account {path} added with {after:g} tickets")
        elif after is None:
            said.append(f"account {path} removed (it had {before:g} tickets)")
        elif before != after:
            said.append(f"account {path}: tickets {before:g} -> {after:g}")
    for user in sorted(old.members.keys() | new.members.keys()):
        if user not in new.members:
            said.append(f"user {user} removed from {old.members[user] or 'the root'}")
            continue
        where, tickets = new.members[user] or "the root", new.user_tickets[user]
        if user not in old.members:
            said.append(f"user {user} added to {where} with {tickets:g} tickets")
            continue
        if old.members[user] != new.members[user]:
            said.append(f"user {user} moved from {old.members[user] or 'the root'} to {where}")
        if old.user_tickets[user] != tickets:
            said.append(f"user {user}: tickets {old.user_tickets[user]:g} -> {tickets:g}")
    return said


def describe_mode(tree: ShareTree) -> str:
    """The tree's fairness mode in words, with its half-life in the decayed mode."""
    if tree.half_life_s is None:
        return tree.fairness
    return f"{tree.fairness} (half-life {_duration_text(tree.half_life_s)})"


def with_tickets(tree: ShareTree, name: str, tickets: float) -> ShareTree:
    """`tree` with the account `name` (a path it defines), else the user `name`, holding
    `tickets`; a user it does not place yet is placed at the root. `SharesFileError` names what
    is wrong."""
    try:
        check_tickets(name, tickets)
    except ValueError as error:
        raise SharesFileError(str(error)) from None
    if name in tree.accounts:
        return dataclasses.replace(tree, accounts={**tree.accounts, name: tickets})
    if not NAME.fullmatch(name):
        raise SharesFileError(f"{name!r}: neither an account of the tree nor a user's name")
    members = {**tree.members, name: tree.members.get(name, ROOT)}
    return dataclasses.replace(
        tree, members=members, user_tickets={**tree.user_tickets, name: tickets}
    )
