"""The subject scheme of CONTRIBUTING.md: builders, parsers and the streams that hold them.

| subject                              | stream          |
|--------------------------------------|-----------------|
| gfair.submit.<user>                  | GFAIR_JOBS      |
| gfair.cancel.<user>                  | GFAIR_JOBS      |
| gfair.job.<user>.<job_id>.<event>    | GFAIR_JOBS      |
| gfair.job.<user>.<job_id>.<event>.<node_id> | GFAIR_JOBS (a node's run report) |
| gfair.node.<node_id>.<event>         | GFAIR_NODES     |
| gfair.cmd.<node_id>.<command>        | GFAIR_COMMANDS  |
| gfair.sched.<event>                  | GFAIR_SCHED     |
| gfair.dlq.<stream>                   | GFAIR_DLQ       |
| gfair.query.<user>.<what>            | none: request/reply with the query service |

Every variable part is a token (`[A-Za-z0-9_-]{1,64}`), so a user, job or node name can never
smuggle a `.` or a wildcard into a subject and widen what a permission or a consumer selects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gfair.events.fields import TOKEN_REGEX

PREFIX = "gfair"
_TOKEN = re.compile(TOKEN_REGEX)


class SubjectError(ValueError):
    """A subject, or a part of one, that does not follow the gfair subject scheme."""


def validate_token(value: str, *, what: str = "token") -> str:
    """Return `value` if it is a legal subject token, else raise `SubjectError` naming `what`."""
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise SubjectError(f"{what} must be 1 to 64 of A-Z a-z 0-9 _ -, not {value!r}")
    return value


# --- builders ---------------------------------------------------------------------------------


def submit_subject(user: str) -> str:
    return f"{PREFIX}.submit.{validate_token(user, what='user')}"


def cancel_subject(user: str) -> str:
    return f"{PREFIX}.cancel.{validate_token(user, what='user')}"


def job_subject(user: str, job_id: str, event: str) -> str:
    return (
        f"{PREFIX}.job.{validate_token(user, what='user')}."
        f"{validate_token(job_id, what='job id')}.{validate_token(event, what='event')}"
    )


def run_report_subject(user: str, job_id: str, event: str, node_id: str) -> str:
    """Where node `node_id` reports on a job it runs: the node is the last token, so a
    permission can hold each executor to its own reports and a consumer can tell who spoke."""
    return f"{job_subject(user, job_id, event)}.{validate_token(node_id, what='node id')}"


def job_events_pattern(user: str, job_id: str | None = None) -> str:
    """What a tool subscribes to for every event of one job, or of all of `user`'s jobs."""
    job = "*" if job_id is None else validate_token(job_id, what="job id")
    return f"{PREFIX}.job.{validate_token(user, what='user')}.{job}.>"


def node_subject(node_id: str, event: str) -> str:
    return (
        f"{PREFIX}.node.{validate_token(node_id, what='node id')}."
        f"{validate_token(event, what='event')}"
    )


def command_subject(node_id: str, command: str) -> str:
    return (
        f"{PREFIX}.cmd.{validate_token(node_id, what='node id')}."
        f"{validate_token(command, what='command')}"
    )


def node_commands_pattern(node_id: str) -> str:
    """What one node executor subscribes to."""
    return f"{PREFIX}.cmd.{validate_token(node_id, what='node id')}.*"


def sched_subject(event: str) -> str:
    return f"{PREFIX}.sched.{validate_token(event, what='event')}"


def dlq_subject(stream: str) -> str:
    return f"{PREFIX}.dlq.{validate_token(stream, what='stream')}"


def query_subject(user: str, what: str) -> str:
    """Where `user` asks the query service `what` (a request; the reply comes to its inbox)."""
    return (
        f"{PREFIX}.query.{validate_token(user, what='user')}.{validate_token(what, what='query')}"
    )


def queries_pattern(user: str | None = None) -> str:
    """Every question `user` may ask; with no user, everybody's (what the service answers)."""
    who = "*" if user is None else validate_token(user, what="user")
    return f"{PREFIX}.query.{who}.*"


def published_by_tenants(subject: str) -> bool:
    """Whether `subject` is one tenants publish on (`gfair.submit.*`, `gfair.cancel.*`).

    What a tenant writes there is untrusted beyond its subject: in particular its envelope
    `time` is the tenant's say, so consumers take the time the stream stored it instead.
    """
    tokens = subject.split(".")
    return len(tokens) == 3 and tokens[0] == PREFIX and tokens[1] in _TENANT_FAMILIES


_TENANT_FAMILIES = frozenset({"submit", "cancel"})


# --- parsers ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobSubject:
    user: str
    job_id: str
    event: str
    node_id: str | None = None  # the reporting node, on a run report's subject


@dataclass(frozen=True, slots=True)
class NodeSubject:
    node_id: str
    event: str


@dataclass(frozen=True, slots=True)
class CommandSubject:
    node_id: str
    command: str


def _split(subject: str, family: str, names: tuple[str, ...]) -> list[str]:
    tokens = subject.split(".")
    shape = ".".join((PREFIX, family, *(f"<{name}>" for name in names)))
    if len(tokens) != 2 + len(names) or tokens[0] != PREFIX or tokens[1] != family:
        raise SubjectError(f"subject {subject!r} is not of the form {shape}")
    for name, token in zip(names, tokens[2:], strict=True):
        validate_token(token, what=f"{name.replace('_', ' ')} in subject {subject!r}")
    return tokens[2:]


def parse_submit_subject(subject: str) -> str:
    """The user of a `gfair.submit.<user>` subject."""
    (user,) = _split(subject, "submit", ("user",))
    return user


def parse_cancel_subject(subject: str) -> str:
    """The user of a `gfair.cancel.<user>` subject."""
    (user,) = _split(subject, "cancel", ("user",))
    return user


def parse_job_subject(subject: str) -> JobSubject:
    """A job event's subject, or a run report's (with the reporting node last)."""
    if subject.count(".") == 5:
        user, job_id, event, node = _split(subject, "job", ("user", "job_id", "event", "node_id"))
        return JobSubject(user, job_id, event, node)
    user, job_id, event = _split(subject, "job", ("user", "job_id", "event"))
    return JobSubject(user, job_id, event)


def parse_node_subject(subject: str) -> NodeSubject:
    node_id, event = _split(subject, "node", ("node_id", "event"))
    return NodeSubject(node_id, event)


def parse_command_subject(subject: str) -> CommandSubject:
    node_id, command = _split(subject, "cmd", ("node_id", "command"))
    return CommandSubject(node_id, command)


@dataclass(frozen=True, slots=True)
class QuerySubject:
    user: str
    what: str


def parse_query_subject(subject: str) -> QuerySubject:
    user, what = _split(subject, "query", ("user", "what"))
    return QuerySubject(user, what)


def parse_sched_subject(subject: str) -> str:
    """The event of a `gfair.sched.<event>` subject."""
    (event,) = _split(subject, "sched", ("event",))
    return event


def parse_dlq_subject(subject: str) -> str:
    """The stream a `gfair.dlq.<stream>` dead letter was read from."""
    (stream,) = _split(subject, "dlq", ("stream",))
    return stream


# --- streams ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventStream:
    """A JetStream stream of the contract: its name and the subjects it captures."""

    name: str
    subjects: tuple[str, ...]
    description: str


JOBS_STREAM = EventStream(
    "GFAIR_JOBS",
    (f"{PREFIX}.submit.*", f"{PREFIX}.cancel.*", f"{PREFIX}.job.>"),
    "Submissions, cancellations and every event of every job's life",
)
NODES_STREAM = EventStream(
    "GFAIR_NODES",
    (f"{PREFIX}.node.>",),
    "Node inventory, heartbeats, GPU telemetry and health transitions",
)
COMMANDS_STREAM = EventStream(
    "GFAIR_COMMANDS",
    (f"{PREFIX}.cmd.>",),
    "Start, suspend, resume, migrate and kill commands for node executors",
)
SCHED_STREAM = EventStream(
    "GFAIR_SCHED",
    (f"{PREFIX}.sched.>",),
    "Quantum ticks, schedule decisions, profiles, entitlements and trades",
)
DLQ_STREAM = EventStream(
    "GFAIR_DLQ",
    (f"{PREFIX}.dlq.>",),
    "Poison messages with the reason they could not be handled",
)
STREAMS: tuple[EventStream, ...] = (
    JOBS_STREAM,
    NODES_STREAM,
    COMMANDS_STREAM,
    SCHED_STREAM,
    DLQ_STREAM,
)

_STREAM_BY_FAMILY: dict[str, EventStream] = {
    "submit": JOBS_STREAM,
    "cancel": JOBS_STREAM,
    "job": JOBS_STREAM,
    "node": NODES_STREAM,
    "cmd": COMMANDS_STREAM,
    "sched": SCHED_STREAM,
    "dlq": DLQ_STREAM,
}


def stream_for_subject(subject: str) -> EventStream:
    """The stream that stores events published on `subject` (a concrete subject or a pattern)."""
    tokens = subject.split(".")
    stream = _STREAM_BY_FAMILY.get(tokens[1]) if len(tokens) >= 3 and tokens[0] == PREFIX else None
    if stream is None:
        raise SubjectError(f"subject {subject!r} belongs to no gfair stream")
    return stream
