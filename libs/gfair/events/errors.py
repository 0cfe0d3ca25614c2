"""Turning validation failures into one reason a person can act on."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError


class InvalidEvent(ValueError):
    """A message that is not a valid gfair event; `reason` says what is wrong and where."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def field_path(loc: Sequence[int | str], root: str = "") -> str:
    """`("gpus",)` -> `data.gpus`; list positions become `[i]`: `data.command[0]`."""
    path = root
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(root)"


def describe_validation_error(error: ValidationError, root: str = "data") -> str:
    """One line per problem, `; `-joined: `data.gpus: Input should be greater than or equal to 1`.

    `root` prefixes every path, so a payload error reads as a path inside the envelope.
    """
    problems = []
    for detail in error.errors(include_url=False):
        message = detail["msg"]
        # Our own validators raise ValueError; pydantic prefixes those with noise.
        message = message.removeprefix("Value error, ")
        problems.append(f"{field_path(detail['loc'], root)}: {message}")
    return "; ".join(problems)
