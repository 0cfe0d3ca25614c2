"""Job arrays and dependencies as a submission carries them (after Slurm's `--array` and
`--dependency=afterok`).

An array is many jobs of one user submitted together, one per index, each an ordinary job with
its own id (`member_job_id`: ``<array id>-<index>``) and its membership (`ArrayMembership`) on
its `JobSubmitted`. The members of one array are those of one user naming the same array id; at
most `limit` of them run in any quantum, the smallest limit a member names (so a member can
only restrict its array, `gfair.core.arrays`). Each member's process sees `ARRAY_INDEX_ENV` and
`ARRAY_ID_ENV`.

An array spec, as `gfair submit --array` and a job spec's `array:` take it: comma-separated
indices and ranges ``A-B``, a range optionally with a step ``A-B:S``, and an optional ``%N``
suffix (at most N running at once): ``0-99``, ``1,3,5-7``, ``0-15:4%2``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gfair.events.fields import TOKEN_REGEX, JobId, require_unique

ARRAY_INDEX_ENV = "GFAIR_ARRAY_INDEX"
ARRAY_ID_ENV = "GFAIR_ARRAY_ID"
# Slurm's default MaxArraySize is 1001; ten times that is still a sweep, not a typo.
MAX_ARRAY_INDEX = 99_999
MAX_ARRAY_JOBS = 10_000
MAX_DEPENDENCIES = 64

_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
_TOKEN = re.compile(TOKEN_REGEX)


class ArraySpecError(ValueError):
    """An array spec that cannot be read, saying which part and why."""


@dataclass(frozen=True, slots=True)
class ArraySpec:
    indices: tuple[int, ...]  # ascending, each once
    limit: int | None  # at most this many running at once; None: no limit


def parse_array_spec(text: str) -> ArraySpec:
    """The indices and limit of an array spec (module doc); `ArraySpecError` naming the fault."""
    body, sep, limit_text = text.strip().partition("%")
    limit: int | None = None
    if sep:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ArraySpecError(
                f"array {text!r}: the limit after % must be a whole number >= 1, got {limit_text!r}"
            )
        limit = int(limit_text)
    if not body:
        raise ArraySpecError(f"array {text!r}: no indices (e.g. 0-99, 1,3,5-7, 0-15:4%2)")
    indices: set[int] = set()
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise ArraySpecError(
                f"array {text!r}: cannot read {part!r}; expected N, A-B or A-B:STEP"
            )
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        step = int(match[3]) if match[3] is not None else 1
        if last < first:
            raise ArraySpecError(f"array {text!r}: range {part!r} ends before it starts")
        if step < 1:
            raise ArraySpecError(f"array {text!r}: step in {part!r} must be >= 1")
        if last > MAX_ARRAY_INDEX:
            raise ArraySpecError(
                f"array {text!r}: index {last} is above the largest, {MAX_ARRAY_INDEX}"
            )
        indices.update(range(first, last + 1, step))
        if len(indices) > MAX_ARRAY_JOBS:
            raise ArraySpecError(f"array {text!r}: more than {MAX_ARRAY_JOBS} jobs")
    return ArraySpec(tuple(sorted(indices)), limit)


def member_job_id(array_id: str, index: int) -> str:
    """The job id of an array's member: ``<array id>-<index>``; `ArraySpecError` when that is
    not a job id (longer than 64 characters, or the array id is not a token)."""
    job_id = f"{array_id}-{index}"
    if not _TOKEN.match(job_id):
        raise ArraySpecError(
            f"array id {array_id!r}: member id {job_id!r} is not a job id "
            "(1 to 64 of A-Z a-z 0-9 _ -)"
        )
    return job_id


class ArrayMembership(BaseModel):
    """Which array a job belongs to, its index there, and the array's limit."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: JobId = Field(description="The array's id, shared by its members (the same user's)")
    index: int = Field(ge=0, le=MAX_ARRAY_INDEX, description="This job's index in the array")
    limit: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ARRAY_JOBS,
        description="At most this many of the array's jobs run at once (Slurm's %N); the "
        "smallest any member names holds",
    )


def array_environment(array: ArrayMembership | None) -> dict[str, str]:
    """What a member's process finds in its environment about its array (nothing outside one).

    Split-stride adds it to every start command of the job, over the job's own `env`, so the
    executor passes it on as it does the job's variables (it is not a host variable, which the
    executor's allowlist would drop)."""
    if array is None:
        return {}
    return {ARRAY_ID_ENV: array.id, ARRAY_INDEX_ENV: str(array.index)}


Dependencies = Annotated[
    tuple[JobId, ...],
    Field(
        max_length=MAX_DEPENDENCIES,
        json_schema_extra={"uniqueItems": True},
        description="Job ids of the same user's jobs that must complete successfully first",
    ),
    AfterValidator(require_unique),
]
