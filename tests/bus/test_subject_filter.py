from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfair.bus.subject_filter import (
    InvalidSubject,
    covers,
    matches,
    matches_any,
    overlaps,
    validate_pattern,
    validate_subject,
)


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("gfair.submit.*", "gfair.submit.alice", True),
        ("gfair.submit.*", "gfair.submit.alice.x", False),
        ("gfair.submit.*", "gfair.submit", False),
        ("gfair.job.>", "gfair.job.alice.j1.placed", True),
        ("gfair.job.>", "gfair.job", False),
        ("gfair.job.*.*.placed", "gfair.job.bob.j2.placed", True),
        ("gfair.job.*.*.placed", "gfair.job.bob.j2.started", False),
        (">", "anything.at.all", True),
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
    ],
)
def test_matches(pattern: str, subject: str, expected: bool) -> None:
    assert matches(pattern, subject) is expected


def test_empty_filter_selects_everything() -> None:
    assert matches_any((), "x.y")
    assert not matches_any(("a.*",), "x.y")


@pytest.mark.parametrize("bad", ["", "a..b", "a.>.b", "a.b*", "a. b", ".a", "a."])
def test_invalid_patterns_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidSubject):
        validate_pattern(bad)


def test_publish_subjects_may_not_hold_wildcards() -> None:
    validate_subject("gfair.submit.alice")
    with pytest.raises(InvalidSubject, match="wildcards"):
        validate_subject("gfair.submit.*")


def test_overlaps_and_covers() -> None:
    assert overlaps("gfair.job.>", "gfair.job.*.*.placed")
    assert not overlaps("gfair.submit.*", "gfair.cancel.*")
    assert covers("gfair.job.>", "gfair.job.*.*.placed")
    assert not covers("gfair.job.*.*.placed", "gfair.job.>")
    assert covers("a.*", "a.b")
    assert not covers("a.b", "a.*")


TOKENS = st.sampled_from(["a", "b", "c"])
PATTERN_TOKENS = st.sampled_from(["a", "b", "*"])


@st.composite
def patterns(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(PATTERN_TOKENS, min_size=1, max_size=3))
    if draw(st.booleans()):
        tokens.append(">")
    return ".".join(tokens)


@given(broad=patterns(), narrow=patterns(), subject=st.lists(TOKENS, min_size=1, max_size=5))
def test_covers_and_overlaps_agree_with_matching(
    broad: str, narrow: str, subject: list[str]
) -> None:
    concrete = ".".join(subject)
    if covers(broad, narrow) and matches(narrow, concrete):
        assert matches(broad, concrete)
    if matches(broad, concrete) and matches(narrow, concrete):
        assert overlaps(broad, narrow)
