"""A job written down as a file, for `gfair submit -f job.yaml`, with a published JSON Schema.

    # job.yaml
    user: alice
    gpus: 2
    name: resnet
    job_type: ResNet-50 (batch size 32)
    command: [python, train.py, --epochs, "90"]
    env: {SEED: "1"}
    array: 0-15%4          # optional: 16 jobs, at most 4 running (gfair.events.job_array)
    after_ok: [prep-3f9c2a] # optional: held until these jobs of the user complete
    time_limit: 4h          # optional: stopped (failed, time_limit) after 4 hours on GPUs

YAML, JSON or TOML (by the file's suffix). Fields are those of a submission
(`gfair.events.submission.JobSubmitted`) under the names of `gfair submit`'s flags; an unknown
field is an error naming it, so a misspelt one is not silently ignored. Flags given on the
command line override the file. `schemas/job-spec.schema.json` is generated from `JobSpec`
(`gfair schemas`), for editors and other tools to validate against.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gfair.events.errors import describe_validation_error
from gfair.events.fields import (
    MAX_RETRIES,
    AbsolutePath,
    Argv,
    Environment,
    GpuCount,
    ImageRef,
    JobId,
    Mount,
    Name,
    Tickets,
    TimeLimit,
    UserName,
    require_unique,
)
from gfair.events.job_array import MAX_DEPENDENCIES, ArraySpecError, parse_array_spec

SCHEMA_FILE = "job-spec.schema.json"
SUFFIXES = (".yaml", ".yml", ".json", ".toml")


class JobSpecError(ValueError):
    """A spec file that cannot be read or is not a valid job, with where and why."""


class JobSpec(BaseModel):
    """A gfair job as a file (`gfair submit -f FILE`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="gfair job spec")

    user: UserName | None = Field(default=None, description="Whose job (default: --user)")
    gpus: GpuCount | None = Field(default=None, description="GPUs the job needs at once")
    command: Argv | None = Field(
        default=None,
        description="Program and arguments, a list (exec'd without a shell), or one string "
        "split as a POSIX shell would split it",
        json_schema_extra=lambda schema: _also_a_string(schema),
    )
    tickets: Tickets | None = Field(default=None, description="Weight among the user's jobs")
    job_type: Name | None = Field(
        default=None, description="Model family, e.g. 'ResNet-50 (batch size 32)'"
    )
    name: Name | None = Field(default=None, description="A label (the stem of its job id)")
    job_id: JobId | None = Field(default=None, description="The job id (default: generated)")
    env: Environment = Field(default_factory=dict)
    workdir: AbsolutePath | None = Field(
        default=None, description="Absolute working directory on the node"
    )
    image: ImageRef | None = Field(
        default=None, description="Run in this container image (default: a process on the node)"
    )
    mounts: tuple[Mount, ...] = Field(
        default=(), description="Host paths mounted into its container: HOST:CONTAINER[:ro]"
    )
    max_retries: int | None = Field(
        default=None, ge=0, le=MAX_RETRIES, description="Cap on retries after failures"
    )
    time_limit: TimeLimit | None = None
    prepare: bool | None = Field(
        default=None,
        description="The job calls Job.from_env() before touching any GPU: its process may "
        "start before it is given GPUs (a prepared start)",
    )
    array: str | None = Field(
        default=None,
        description="Submit a job array, one job per index: '0-99', '1,3,5-7', '0-15:4', with "
        "an optional '%N' suffix (at most N running at once)",
        examples=["0-99%8"],
    )
    after_ok: tuple[JobId, ...] = Field(
        default=(),
        max_length=MAX_DEPENDENCIES,
        description="Job ids (of the same user) that must complete successfully first; a list, "
        "or one comma-separated string",
        json_schema_extra=lambda schema: _list_or_string(schema),
    )

    @field_validator("array")
    @classmethod
    def _array(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_array_spec(value)
            except ArraySpecError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("after_ok", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("after_ok")
    @classmethod
    def _unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(require_unique(value))

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                raise ValueError(f"cannot split {value!r}: {exc}") from None
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _strings(cls, value: Any) -> Any:
        # YAML and TOML read `SEED: 1` as a number; the environment holds strings.
        if isinstance(value, dict):
            return {k: v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}
        return value


def _also_a_string(schema: dict[str, Any]) -> None:
    schema["anyOf"].insert(1, {"type": "string", "minLength": 1})


def _list_or_string(schema: dict[str, Any]) -> None:
    listed = {k: schema.pop(k) for k in ("type", "items", "maxItems") if k in schema}
    schema["anyOf"] = [{**listed, "uniqueItems": True}, {"type": "string", "minLength": 1}]


def spec_schema() -> dict[str, Any]:
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_FILE
    return schema


def load_job_spec(path: Path) -> JobSpec:
    """The job in `path`; `JobSpecError` saying what is wrong (and where, when it can)."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise JobSpecError(f"{path}: a job spec is {', '.join(SUFFIXES)}, not {suffix or '?'}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobSpecError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise JobSpecError(f"{path}: not UTF-8 text") from None
    document = _parse(path, suffix, text)
    if not isinstance(document, dict):
        raise JobSpecError(f"{path}: expected a mapping of fields, got {type(document).__name__}")
    try:
        return JobSpec.model_validate(document)
    except ValidationError as exc:
        raise JobSpecError(f"{path}: {describe_validation_error(exc, root='')}") from None


def _parse(path: Path, suffix: str, text: str) -> Any:
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise JobSpecError(f"{path}:{exc.lineno}:{exc.colno}: {exc.msg}") from None
    if suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise JobSpecError(f"{path}: {exc}") from None
    import yaml  # only a YAML spec pays for it

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise JobSpecError(f"{path}{where}: {problem}") from None
