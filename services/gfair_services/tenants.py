"""Users' tickets: the one piece of tenant configuration several services must agree on.

Placement, split-stride and the trading auction all derive shares from the same tickets, so
they read them from the same settings: ``GFAIR_USER_TICKETS="alice=2,bob=1"`` (or the JSON
object ``{"alice": 2, "bob": 1}``), and ``GFAIR_DEFAULT_TICKETS`` for everyone else; and
``GFAIR_SHARES_FILE``, a shares file (docs/configuration.md, "Shares file"): accounts in a tree
above the users, read once when the settings are made (a bad file stops the service at start,
naming the line and field). A user the file names has the file's tickets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BeforeValidator, Field, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gfair.core.shares_file import render_shares
from gfair.core.shares_tree import ShareTree
from gfair.core.tickets import check_tickets
from gfair.events.subjects import SubjectError, validate_token
from gfair.shares import read_shares


def parse_user_tickets(value: Any) -> dict[str, float]:
    """``"alice=2,bob=1"``, a JSON object or a mapping -> ``{"alice": 2.0, "bob": 1.0}``.

    Raises `ValueError` naming the offending item.
    """
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"user tickets: not a JSON object ({error})") from None
        else:
            pairs: dict[str, Any] = {}
            for position, item in enumerate(text.split(","), start=1):
                name, sep, number = item.partition("=")
                if not sep:
                    raise ValueError(
                        f"user tickets item {position} ({item.strip()!r}): expected USER=TICKETS"
                    )
                pairs[name.strip()] = number.strip()
            value = pairs
    if not isinstance(value, Mapping):
        raise ValueError("user tickets: expected USER=TICKETS[,USER=TICKETS...] or a JSON object")
    out: dict[str, float] = {}
    for user, raw in value.items():
        try:
            validate_token(str(user), what="user")
            tickets = float(raw)
        except (SubjectError, TypeError, ValueError) as error:
            raise ValueError(f"user tickets of {user!r}: {error}") from None
        out[str(user)] = check_tickets(f"user tickets of {user!r}", tickets)
    return out


UserTickets = Annotated[dict[str, float], NoDecode, BeforeValidator(parse_user_tickets)]


class TenantSettings(BaseSettings):
    """Mixin of the tenant fields; a service's `Settings` inherits it."""

    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    user_tickets: UserTickets = Field(
        default_factory=dict, description="Tickets per user, e.g. alice=2,bob=1"
    )
    default_tickets: float = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="Tickets of users not listed"
    )
    shares_file: Path | None = Field(
        default=None,
        description="Shares file (TOML): accounts in a tree above the users "
        "(docs/configuration.md); its users have its tickets",
    )
    _shares: ShareTree | None = PrivateAttr(default=None)
    _shares_text: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _read_shares(self) -> Self:
        if self.shares_file is not None:
            self._shares = read_shares(self.shares_file)  # SharesFileError is a ValueError
            self._shares_text = render_shares(self._shares)
        return self

    @property
    def shares(self) -> ShareTree | None:
        """The shares file's tree, or None without one."""
        return self._shares

    @property
    def shares_text(self) -> str:
        """The shares file's tree as a shares file (`render_shares`); "" without one."""
        return self._shares_text

    def flat_tickets_of(self, user: str) -> float:
        """The user's tickets without the shares file (`GFAIR_USER_TICKETS` or the default)."""
        return self.user_tickets.get(user, self.default_tickets)

    def tickets_of(self, user: str) -> float:
        flat = self.user_tickets.get(user, self.default_tickets)
        return flat if self._shares is None else self._shares.tickets_of(user, flat)

    def tickets_map(self, users: Mapping[str, object]) -> dict[str, float]:
        return {user: self.tickets_of(user) for user in users}
