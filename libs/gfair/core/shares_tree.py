"""Accounts in a tree, and the hierarchical water-fill of the cluster's GPUs (docs/design.md §1.1).

A `ShareTree` names accounts by path (``research``, ``research/vision``: an account's parent is
its path less the last segment, the root is ``""``) and places users in them. Every account and
every user holds tickets. The GPUs are divided top-down: the root's capacity is water-filled
(`tickets.water_fill`) among its *active* children, the sub-accounts with a user with demand
below them and the users with demand placed directly in it, in proportion to their tickets and
capped by their demand (an account's demand is the sum of its users'); each account's result is
then water-filled the same way among its own active children, down to the users.

Because an account is capped by what its subtree asks, what a child cannot use is divided among
its siblings first; only what the whole subtree cannot use is left to the account's parent to
give to the account's siblings, and so on up the tree.

Users not placed in the tree are children of the root, with the tickets their caller gives
(the flat tickets, `GFAIR_USER_TICKETS` or the default). A tree without accounts is thus one
water-fill among the users, the flat rule: `fill` then performs exactly the arithmetic of
`tickets.water_fill` on the same inputs, in the same order, so its result is bit-identical.

The tree also carries the fairness mode of its file: ``instantaneous`` (tickets alone), or
``decayed`` with a half-life, in which the drivers pass each user's decayed usage to `fill` and
siblings are weighed by `usage_decay.fair_share_weights` (docs/design.md §1.1).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from gfair.core.tickets import check_tickets, water_fill
from gfair.core.usage_decay import fair_share_weights

ROOT: Final = ""
# An account path's segments and users' names: what the event contract allows a user name
# (`gfair.events.subjects`), so that an account can be shown, and a user placed, everywhere.
NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ACCOUNT: Final = 0
_USER: Final = 1
INSTANTANEOUS: Final = "instantaneous"
DECAYED: Final = "decayed"
FAIRNESS: Final = (INSTANTANEOUS, DECAYED)


def parent_of(path: str) -> str:
    """The account above `path` (the root for a top-level account)."""
    return path.rpartition("/")[0]


def depth_of(path: str) -> int:
    """0 for the root, 1 for a top-level account, and one more per level below."""
    return 0 if path == ROOT else path.count("/") + 1


@dataclass(frozen=True)
class ShareTree:
    """Accounts (path -> tickets) and the users placed in them (user -> account, tickets)."""

    accounts: Mapping[str, float] = field(default_factory=dict)
    members: Mapping[str, str] = field(default_factory=dict)  # user -> account path
    user_tickets: Mapping[str, float] = field(default_factory=dict)  # users in `members`
    fairness: str = INSTANTANEOUS  # one of FAIRNESS
    half_life_s: float | None = None  # the decayed mode's half-life; None otherwise

    def __post_init__(self) -> None:
        if self.fairness not in FAIRNESS:
            raise ValueError(f"fairness {self.fairness!r}: one of {', '.join(FAIRNESS)}")
        if self.fairness == DECAYED:
            if self.half_life_s is None or not (
                math.isfinite(self.half_life_s) and self.half_life_s > 0
            ):
                raise ValueError(f"half_life_s must be a finite number > 0, not {self.half_life_s}")
        elif self.half_life_s is not None:
            raise ValueError("half_life_s is the decayed mode's: instantaneous has none")
        for path, tickets in self.accounts.items():
            check_path(path)
            check_tickets(f"account {path}", tickets)
            parent = parent_of(path)
            if parent != ROOT and parent not in self.accounts:
                raise ValueError(f"account {path}: its parent account {parent} is not defined")
        for user, account in self.members.items():
            if not NAME.fullmatch(user):
                raise ValueError(f"user {user!r}: a name is 1 to 64 of A-Z a-z 0-9 _ -")
            if account != ROOT and account not in self.accounts:
                raise ValueError(f"user {user}: account {account} is not defined")
            if user not in self.user_tickets:
                raise ValueError(f"user {user}: has an account but no tickets")
            check_tickets(f"user {user}", self.user_tickets[user])
        for user in self.user_tickets.keys() - self.members.keys():
            raise ValueError(f"user {user}: has tickets but no account")

    @property
    def flat(self) -> bool:
        """No accounts: every user is a child of the root (the flat rule)."""
        return not self.accounts

    @property
    def decayed(self) -> bool:
        """The decayed mode: drivers keep usage (`usage_decay.DecayedUsage`) and pass it in."""
        return self.fairness == DECAYED

    @property
    def plain(self) -> bool:
        """Nothing beyond flat tickets: no accounts, no user placed, the instantaneous mode."""
        return not self.accounts and not self.members and not self.decayed

    def account_of(self, user: str) -> str:
        return self.members.get(user, ROOT)

    def tickets_of(self, user: str, otherwise: float) -> float:
        """The user's tickets in the tree, or `otherwise` for a user the tree does not place."""
        return self.user_tickets.get(user, otherwise)

    def ancestors(self, path: str) -> tuple[str, ...]:
        """`path` and every account above it, the root excluded, nearest first."""
        chain: list[str] = []
        while path != ROOT:
            chain.append(path)
            path = parent_of(path)
        return tuple(chain)

    def fill(
        self,
        capacity: float,
        tickets: Mapping[str, float],
        demand: Mapping[str, float],
        usage: Mapping[str, float] | None = None,
    ) -> TreeFill:
        """Water-fill `capacity` down the tree (module doc): each user with an entry in `demand`
        gets its GPUs, each account with demand below it the GPUs of its subtree.

        `tickets` are every user's with demand; a user placed in the tree has its own. With
        `usage` (user -> decayed GPU-seconds, `usage_decay`), siblings weigh their usage
        against their share (`usage_decay.fair_share_weights`) instead of their bare tickets.
        """
        for user, asked in demand.items():
            if asked < 0:
                raise ValueError(f"{user}: demand must be >= 0, got {asked}")
        below: dict[str, float] = {}  # account -> demand of its subtree
        children: dict[str, list[str]] = {}  # account -> its active sub-accounts
        users_in: dict[str, list[str]] = {ROOT: []}  # account -> its users, in demand order
        for user, asked in demand.items():
            account = self.account_of(user)
            users_in.setdefault(account, []).append(user)
            for path in self.ancestors(account):
                below[path] = below.get(path, 0.0) + asked
        for path, asked in below.items():
            if asked > 0:
                children.setdefault(parent_of(path), []).append(path)
        used: dict[tuple[int, str], float] = {}  # sibling key -> decayed usage
        for user, value in (usage or {}).items():
            used[_USER, user] = value
            for path in self.ancestors(self.account_of(user)):
                used[_ACCOUNT, path] = used.get((_ACCOUNT, path), 0.0) + value
        users: dict[str, float] = {}
        accounts: dict[str, float] = {}
        # Parents before children: an account's GPUs are known before they are divided.
        pending = [(ROOT, float(capacity))]
        while pending:
            account, gpus = pending.pop()
            # Keyed (kind, name): a user and an account may have the same name.
            weights: dict[tuple[int, str], float] = {}
            asked_by: dict[tuple[int, str], float] = {}
            for path in sorted(children.get(account, ())):
                weights[_ACCOUNT, path] = self.accounts[path]
                asked_by[_ACCOUNT, path] = below[path]
            for user in users_in.get(account, ()):
                if not demand[user] > 0:
                    continue  # not active: no part in the division (it gets 0)
                weight = self.user_tickets.get(user, tickets.get(user))
                if weight is None:
                    raise ValueError(f"{user}: has a demand but no tickets")
                weights[_USER, user] = weight
                asked_by[_USER, user] = demand[user]
            if usage is not None:
                weights = fair_share_weights(weights, used)
            for (kind, name), value in water_fill(gpus, weights, asked_by).items():
                if kind == _ACCOUNT:
                    accounts[name] = value
                    pending.append((name, value))
                else:
                    users[name] = value
        return TreeFill({user: users.get(user, 0.0) for user in demand}, accounts)

    def water_fill(
        self,
        capacity: float,
        tickets: Mapping[str, float],
        demand: Mapping[str, float],
        usage: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """User -> GPUs: `fill`'s users."""
        return self.fill(capacity, tickets, demand, usage).users


@dataclass(frozen=True)
class TreeFill:
    users: dict[str, float]  # user -> GPUs, every user with an entry in the demand
    accounts: dict[str, float]  # account path -> GPUs of its subtree, accounts with demand


def check_path(path: str) -> str:
    """`path` if it is an account path (segments of `NAME` joined by ``/``), else ValueError."""
    segments = path.split("/")
    for segment in segments:
        if not NAME.fullmatch(segment):
            raise ValueError(
                f"account {path!r}: each part of a path (between '/') is 1 to 64 of "
                f"A-Z a-z 0-9 _ -, not {segment!r}"
            )
    return path
