"""NATS subject patterns: `*` matches one token, `>` matches one or more trailing tokens."""

from __future__ import annotations

import re
from functools import lru_cache

# A concrete subject: non-empty tokens without wildcards or whitespace (checked on every publish).
_CONCRETE = re.compile(r"[^\s.*>]+(?:\.[^\s.*>]+)*")


class InvalidSubject(ValueError):
    """A subject or pattern that NATS would reject."""


def _tokens(subject: str, *, wildcards: bool) -> tuple[str, ...]:
    if not subject:
        raise InvalidSubject("subject is empty")
    tokens = tuple(subject.split("."))
    for index, token in enumerate(tokens):
        if not token:
            raise InvalidSubject(f"subject {subject!r} has an empty token")
        if any(c.isspace() for c in token):
            raise InvalidSubject(f"subject {subject!r} contains whitespace")
        if token in ("*", ">"):
            if not wildcards:
                raise InvalidSubject(f"subject {subject!r} may not contain wildcards")
            if token == ">" and index != len(tokens) - 1:
                raise InvalidSubject(f"pattern {subject!r}: '>' must be the last token")
        elif "*" in token or ">" in token:
            if not wildcards:
                raise InvalidSubject(f"subject {subject!r} may not contain wildcards")
            raise InvalidSubject(f"pattern {subject!r}: wildcards must be whole tokens")
    return tokens


def validate_pattern(pattern: str) -> None:
    _tokens(pattern, wildcards=True)


def validate_subject(subject: str) -> None:
    """A subject to publish on: no wildcards."""
    if not _CONCRETE.fullmatch(subject):
        _tokens(subject, wildcards=False)  # raises, naming the problem
        raise InvalidSubject(f"subject {subject!r} is not valid")


@lru_cache(maxsize=4096)
def _pattern_tokens(pattern: str) -> tuple[str, ...]:
    return _tokens(pattern, wildcards=True)


def matches(pattern: str, subject: str) -> bool:
    """Whether a concrete `subject` is selected by `pattern`."""
    want = _pattern_tokens(pattern)
    have = subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have):
            return False
        if token != "*" and token != have[index]:
            return False
    return len(have) == len(want)


def matches_any(patterns: tuple[str, ...], subject: str) -> bool:
    """An empty pattern set selects everything (a consumer without a filter)."""
    return not patterns or any(matches(p, subject) for p in patterns)


def overlaps(left: str, right: str) -> bool:
    """Whether some concrete subject matches both patterns (streams may not overlap)."""
    a, b = _pattern_tokens(left), _pattern_tokens(right)
    for index in range(max(len(a), len(b))):
        ta = a[index] if index < len(a) else None
        tb = b[index] if index < len(b) else None
        if ta == ">" or tb == ">":
            return ta is not None and tb is not None
        if ta is None or tb is None:
            return False
        if ta != "*" and tb != "*" and ta != tb:
            return False
    return True


def covers(broad: str, narrow: str) -> bool:
    """Whether every subject matched by `narrow` is also matched by `broad`."""
    b, n = _pattern_tokens(broad), _pattern_tokens(narrow)
    for index, token in enumerate(b):
        if token == ">":
            return len(n) > index
        if index >= len(n) or n[index] == ">":
            return False
        if token != "*" and (n[index] == "*" or n[index] != token):
            return False
    return len(n) == len(b)
