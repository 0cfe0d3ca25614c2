"""Array specs and the batch fields of a submission (`gfair.events.job_array`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gfair.events.job_array import (
    ArrayMembership,
    ArraySpecError,
    array_environment,
    member_job_id,
    parse_array_spec,
)
from gfair.events.submission import JobSubmitted


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("1,3,5-7", (1, 3, 5, 6, 7), None),
        ("0-15:4", (0, 4, 8, 12), None),
        ("0-15:4%2", (0, 4, 8, 12), 2),
        ("7", (7,), None),
        ("3,1,3", (1, 3), None),
        (" 0-1 %1", (0, 1), 1),
    ],
)
def test_array_specs_are_read_like_slurms(
    text: str, indices: tuple[int, ...], limit: int | None
) -> None:
    spec = parse_array_spec(text)
    assert spec.indices == indices
    assert spec.limit == limit


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no indices"),
        ("%2", "no indices"),
        ("5-2", "ends before it starts"),
        ("0-9:0", "step"),
        ("a-b", "cannot read 'a-b'"),
        ("0-9%0", "whole number >= 1"),
        ("0-9%x", "whole number >= 1"),
        ("-1", "cannot read"),
        ("0-100000", "above the largest"),
        ("0-20000", "more than 10000 jobs"),
        ("0-99999:1", "more than 10000 jobs"),
    ],
)
def test_bad_array_specs_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ArraySpecError, match=says):
        parse_array_spec(text)


def test_member_ids_must_be_job_ids() -> None:
    assert member_job_id("sweep", 12) == "sweep-12"
    with pytest.raises(ArraySpecError, match="not a job id"):
        member_job_id("x" * 62, 100)


def _submission(**fields: object) -> JobSubmitted:
    base: dict[str, object] = {"user": "alice", "job_id": "sweep-3", "gpus": 1, "command": ["x"]}
    return JobSubmitted.model_validate({**base, **fields})


def test_a_member_carries_its_array_and_the_job_sees_its_index() -> None:
    job = _submission(array={"id": "sweep", "index": 3, "limit": 2}, after_ok=["prep"])
    assert job.array == ArrayMembership(id="sweep", index=3, limit=2)
    assert array_environment(job.array) == {"GFAIR_ARRAY_ID": "sweep", "GFAIR_ARRAY_INDEX": "3"}
    assert array_environment(None) == {}


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"array": {"id": "sweep", "index": 4}}, "'sweep-4'"),
        ({"array": {"id": "sweep", "index": 3, "limit": 0}}, "limit"),
        ({"after_ok": ["sweep-3"]}, "cannot wait for itself"),
        ({"after_ok": ["a", "a"]}, "unique"),
        ({"after_ok": ["alice/a"]}, "after_ok"),
    ],
)
def test_bad_batch_fields_are_refused_with_the_reason(fields: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        _submission(**fields)
