"""Constrained field types shared by every event payload.

Each type carries its constraint in a form pydantic validates and JSON Schema states, so the
generated schemas tell a tool author in another language exactly what the services accept.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue

from gfair.core.tickets import MAX_TICKETS, MIN_TICKETS

TOKEN_REGEX = r"^[A-Za-z0-9_-]{1,64}$"
GENERATION_REGEX = r"^[A-Za-z0-9_-]{1,32}$"
ENV_NAME_REGEX = r"^[A-Za-z_][A-Za-z0-9_]{0,255}$"

# A gang larger than this is a typo, not a job: the Philly trace's largest asks for 128 GPUs.
MAX_GANG_GPUS = 4096
# NVML numbers GPUs per server from 0; no server carries more than a few dozen.
MAX_GPU_INDEX = 255
MAX_ATTEMPTS = 1000
MAX_RETRIES = 100
MAX_ARGV_ITEMS = 4096
MAX_ARG_CHARS = 128 * 1024
MAX_REASON_CHARS = 4096
# The tail of stderr that travels with an exit: enough for a traceback, small enough for a message.
MAX_STDERR_TAIL_CHARS = 16 * 1024
MAX_PATH_CHARS = 4096
MAX_ENV_VARS = 1024

H = TypeVar("H", bound=Hashable)


def _no_nul(value: str) -> str:
    # execve(2) and the filesystem stop at NUL: a NUL would silently truncate the string.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def require_unique(items: Sequence[H]) -> Sequence[H]:
    seen: set[H] = set()
    repeated: list[str] = []
    for item in items:
        if item in seen:
            repeated.append(str(item))
        seen.add(item)
    if repeated:
        raise ValueError(f"items must be unique; repeated: {', '.join(sorted(set(repeated)))}")
    return items


def _program_first(argv: tuple[str, ...]) -> tuple[str, ...]:
    if not argv[0]:
        raise ValueError("the program (first item) must not be empty")
    return argv


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("must be an absolute path")
    return value


Token = Annotated[
    str,
    Field(
        pattern=TOKEN_REGEX,
        description="A NATS subject token: 1 to 64 of A-Z a-z 0-9 _ -",
    ),
]
"""User names, job ids, node ids and stream names travel as subject tokens."""

UserName = Token
JobId = Token
NodeId = Token

Generation = Annotated[
    str,
    Field(
        pattern=GENERATION_REGEX,
        description="GPU generation (pool), e.g. k80, v100, a100; stored lower-case",
    ),
    # Pools are compared by name across producers (NVML, the Gavel table, operators): one case.
    AfterValidator(str.lower),
]

GpuCount = Annotated[int, Field(ge=1, le=MAX_GANG_GPUS, description="Number of GPUs")]
GpuIndex = Annotated[int, Field(ge=0, le=MAX_GPU_INDEX, description="NVML index on its server")]
# `uniqueItems` states in the schema what `require_unique` enforces.
UNIQUE: dict[str, JsonValue] = {"uniqueItems": True}

GpuIndices = Annotated[
    tuple[GpuIndex, ...],
    Field(
        min_length=1,
        max_length=MAX_GPU_INDEX + 1,
        json_schema_extra=UNIQUE,
        description="NVML indices of GPUs on one server, each once",
    ),
    AfterValidator(require_unique),
]
Attempt = Annotated[int, Field(ge=1, le=MAX_ATTEMPTS, description="1 for the first run")]
Tickets = Annotated[
    float,
    Field(
        ge=MIN_TICKETS,
        le=MAX_TICKETS,
        allow_inf_nan=False,
        description=f"Share weight, from {MIN_TICKETS:g} to {MAX_TICKETS:g}",
    ),
]
Rate = Annotated[float, Field(ge=0, allow_inf_nan=False, description="Mini-batches per second")]
Ratio = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False, description="Duration in seconds")]
PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_UNITS_FORM = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_CLOCK_FORM = re.compile(r"(?:(\d+)-)?(\d+):(\d\d):(\d\d)")  # Slurm's [D-]HH:MM:SS


def duration_seconds(value: Any) -> Any:
    """Seconds of a duration written `4h`, `90m`, `1h30m`, `30s`, `2d`, `1-12:00:00` (Slurm's
    `D-HH:MM:SS`) or `HH:MM:SS`; a number, or a string of one, is seconds (Slurm's plain
    number is minutes: gfair counts in seconds everywhere)."""
    if not isinstance(value, str) or not (text := value.strip().lower()):
        return value
    if (clock := _CLOCK_FORM.fullmatch(text)) is not None:
        days, hours, minutes, seconds = (int(part or 0) for part in clock.groups())
        if minutes > 59 or seconds > 59:
            raise ValueError("minutes and seconds run to 59")
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    units = _UNITS_FORM.fullmatch(text)
    if units is None or not any(units.groups()):
        try:
            return float(text)
        except ValueError:
            raise ValueError(
                "expected seconds or a duration: 4h, 90m, 1h30m, 30s, D-HH:MM:SS"
            ) from None
    return sum(int(n) * size for n, size in zip(units.groups(), _UNITS.values(), strict=True) if n)


TimeLimit = Annotated[
    PositiveSeconds,
    BeforeValidator(duration_seconds, json_schema_input_type=float | str),
    Field(
        description="Longest running time (holding GPUs), in seconds or as 4h, 90m, 1h30m, "
        "D-HH:MM:SS; past it the job is stopped and fails with failure class time_limit",
        examples=[14400, "4h", "1h30m", "1-00:00:00"],
    ),
]
Share = Annotated[float, Field(ge=0, allow_inf_nan=False, description="GPUs, may be fractional")]
Step = Annotated[int, Field(ge=0, description="Training step (mini-batches done)")]
Bytes = Annotated[int, Field(ge=0, description="Bytes")]

ExitStatus = Annotated[int, Field(ge=0, le=255, description="Exit status of a process")]
SignalNumber = Annotated[int, Field(ge=1, le=64, description="Signal that ended a process")]
XidCode = Annotated[int, Field(ge=0, le=65535, description="NVML XID error code")]

Reason = Annotated[str, Field(min_length=1, max_length=MAX_REASON_CHARS)]
StderrTail = Annotated[str, Field(max_length=MAX_STDERR_TAIL_CHARS)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
AbsolutePath = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_PATH_CHARS,
        description="Absolute path",
        json_schema_extra={"pattern": "^/"},
    ),
    AfterValidator(_absolute),
    AfterValidator(_no_nul),
]

Argument = Annotated[str, Field(max_length=MAX_ARG_CHARS), AfterValidator(_no_nul)]
Argv = Annotated[
    tuple[Argument, ...],
    Field(
        min_length=1,
        max_length=MAX_ARGV_ITEMS,
        description="Program and arguments, exec'd without a shell; the first is non-empty",
    ),
    AfterValidator(_program_first),
]
EnvName = Annotated[str, Field(pattern=ENV_NAME_REGEX)]
EnvValue = Annotated[str, Field(max_length=MAX_ARG_CHARS), AfterValidator(_no_nul)]
Environment = Annotated[
    dict[EnvName, EnvValue],
    Field(max_length=MAX_ENV_VARS, description="Extra environment variables for the job process"),
]


def _mount(value: str) -> str:
    parts = value.split(":")
    if len(parts) not in (2, 3) or not all(p.startswith("/") for p in parts[:2]):
        raise ValueError(f"mount {value!r} must be HOST:CONTAINER or HOST:CONTAINER:ro")
    if len(parts) == 3 and parts[2] != "ro":
        raise ValueError(f"mount {value!r}: the only option is ro")
    if any(".." in p.split("/") for p in parts[:2]):
        raise ValueError(f"mount {value!r}: no '..' in its paths")
    return value


# A container image reference as the engine takes it ([registry/]name[:tag][@digest]).
ImageRef = Annotated[
    str,
    Field(
        min_length=1,
        max_length=512,
        pattern=r"^[a-z0-9][a-z0-9._\-/:@]*$",
        description="Container image the job runs in (the node's Docker engine)",
    ),
]
Mount = Annotated[
    str,
    Field(
        min_length=3,
        max_length=2 * MAX_PATH_CHARS + 3,
        description="A host path mounted into the job's container: HOST:CONTAINER[:ro]",
    ),
    AfterValidator(_mount),
]


class JobRef(BaseModel):
    """A job's identity: job ids are chosen per user, so the pair is what is unique."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    user: UserName
    job_id: JobId

    def __str__(self) -> str:
        return f"{self.user}/{self.job_id}"


NodeIds = Annotated[
    tuple[NodeId, ...],
    Field(min_length=1, max_length=MAX_GANG_GPUS, json_schema_extra=UNIQUE),
    AfterValidator(require_unique),
]

JobRefs = Annotated[
    tuple[JobRef, ...], Field(json_schema_extra=UNIQUE), AfterValidator(require_unique)
]
