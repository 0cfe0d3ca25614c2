"""Streams, durable consumers and key-value buckets, declared as data.

A service declares what it reads and where it keeps state; `Bus.ensure_topology` creates or
updates all of it idempotently, so every process can declare the same topology on start and
the first one to get there creates it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from gfair.bus.subject_filter import covers, validate_pattern
from gfair.events.envelope import EventData
from gfair.events.subjects import DLQ_STREAM, STREAMS, dlq_subject, stream_for_subject

DEAD_LETTER_STREAM = DLQ_STREAM.name

T = TypeVar("T")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class DeliverPolicy(StrEnum):
    """Where a new durable consumer starts reading; an existing one keeps its position."""

    ALL = "all"
    NEW = "new"
    LAST = "last"
    LAST_PER_SUBJECT = "last_per_subject"
    BY_START_SEQUENCE = "by_start_sequence"


class Storage(StrEnum):
    FILE = "file"
    MEMORY = "memory"


def _check_name(kind: str, name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"{kind} name {name!r} must match [A-Za-z0-9_-]{{1,64}}")


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A JetStream stream: the durable log of every event published on `subjects`."""

    name: str
    subjects: tuple[str, ...]
    description: str = ""
    # Publishes repeating an event id within this window are stored once (docs/design.md §3.2).
    duplicate_window_s: float = 120.0
    max_age_s: float | None = None
    max_bytes: int | None = None
    # The oldest messages of a subject go first once it holds this many, so a flood on one
    # subject (one tenant's submissions) cannot push anyone else's messages out.
    max_msgs_per_subject: int | None = None
    max_msg_size: int | None = None
    storage: Storage = Storage.FILE
    replicas: int = 1

    def __post_init__(self) -> None:
        _check_name("stream", self.name)
        if not self.subjects:
            raise ValueError(f"stream {self.name} has no subjects")
        for subject in self.subjects:
            validate_pattern(subject)
        if self.duplicate_window_s <= 0:
            raise ValueError(f"stream {self.name}: duplicate_window_s must be > 0")
        if self.replicas < 1:
            raise ValueError(f"stream {self.name}: replicas must be >= 1")


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """A durable pull consumer; every process binding the same `durable` shares its messages.

    That sharing is the queue-group style scale-out: run the same service twice and each
    event is handled by one of the two.
    """

    stream: str
    durable: str
    filter_subjects: tuple[str, ...] = ()
    deliver_policy: DeliverPolicy = DeliverPolicy.ALL
    start_sequence: int | None = None
    # Unacknowledged deliveries come back after this long; long handlers keep their message
    # alive with in-progress signals, so this bounds how long a crashed worker holds an event.
    ack_wait_s: float = 30.0
    # Attempts (deliveries) before a failing message is dead-lettered. The runtime counts them
    # from the delivery metadata; the server's own max_deliver stays unlimited so that it never
    # drops a message silently.
    max_attempts: int = 5
    max_ack_pending: int = 1000
    description: str = ""

    def __post_init__(self) -> None:
        _check_name("stream", self.stream)
        _check_name("consumer", self.durable)
        for subject in self.filter_subjects:
            validate_pattern(subject)
        if self.max_attempts < 1:
            raise ValueError(f"consumer {self.durable}: max_attempts must be >= 1")
        if self.ack_wait_s <= 0:
            raise ValueError(f"consumer {self.durable}: ack_wait_s must be > 0")
        if (self.deliver_policy is DeliverPolicy.BY_START_SEQUENCE) != (
            self.start_sequence is not None
        ):
            raise ValueError(
                f"consumer {self.durable}: start_sequence goes with deliver_policy "
                "by_start_sequence and only with it"
            )


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """A JetStream key-value bucket holding one kind of service record."""

    name: str
    description: str = ""
    history: int = 1
    ttl_s: float | None = None
    storage: Storage = Storage.FILE
    replicas: int = 1

    def __post_init__(self) -> None:
        _check_name("bucket", self.name)
        if not 1 <= self.history <= 64:
            raise ValueError(f"bucket {self.name}: history must be within 1..64")


def consumer_for(
    models: tuple[type[EventData], ...], *, durable: str, **options: Any
) -> ConsumerSpec:
    """A durable consumer of exactly the subjects that events of `models` are published on.

    `options` are the other `ConsumerSpec` fields (ack_wait_s, max_attempts, ...).
    """
    if not models:
        raise ValueError(f"consumer {durable}: name at least one event model")
    patterns = {model.subject_pattern() for model in models}
    # JetStream rejects overlapping filters; a pattern inside a broader one adds nothing.
    kept = tuple(sorted(p for p in patterns if not any(q != p and covers(q, p) for q in patterns)))
    streams = sorted({stream_for_subject(p).name for p in kept})
    if len(streams) != 1:
        raise ValueError(
            f"consumer {durable}: events of {[m.__name__ for m in models]} live in "
            f"{len(streams)} streams ({', '.join(streams)}); a consumer reads one"
        )
    return ConsumerSpec(stream=streams[0], durable=durable, filter_subjects=kept, **options)


def dead_letter_subject(stream: str) -> str:
    """Where poison messages read from `stream` are parked, with the reason."""
    return dlq_subject(stream)


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """How much a stream keeps before it drops its oldest messages (None: no such limit)."""

    max_bytes: int
    max_age_s: float | None = None
    max_msgs_per_subject: int | None = None
    max_msg_size: int | None = None


_GIB = 1024**3
_DAY_S = 86_400.0
# Every stream is bounded in bytes, so nothing published (a flood of rejected submissions
# included) can fill the broker's disk (issue 11). Ages only where no service rebuilds from
# the history: placement rebuilds its node inventory from GFAIR_NODES, which is bounded per
# subject instead, so the last registration and health verdict of every node stay.
CONTRACT_LIMITS: dict[str, StreamLimits] = {
    # Per subject: one tenant's submissions (gfair.submit.<t>), one job's events of one kind.
    "GFAIR_JOBS": StreamLimits(
        max_bytes=8 * _GIB,
        max_age_s=90 * _DAY_S,
        max_msgs_per_subject=100_000,
        max_msg_size=1024 * 1024,
    ),
    "GFAIR_NODES": StreamLimits(max_bytes=2 * _GIB, max_msgs_per_subject=1_000),
    # A command older than an executor's command_max_age_s (120 s) is not carried out anyway.
    "GFAIR_COMMANDS": StreamLimits(max_bytes=_GIB, max_age_s=7 * _DAY_S),
    "GFAIR_SCHED": StreamLimits(max_bytes=2 * _GIB, max_age_s=7 * _DAY_S),
    "GFAIR_DLQ": StreamLimits(max_bytes=_GIB, max_age_s=30 * _DAY_S),
}


def contract_streams(
    *,
    storage: Storage = Storage.FILE,
    replicas: int = 1,
    duplicate_window_s: float = 120.0,
    max_age_s: float | None = None,
) -> tuple[StreamSpec, ...]:
    """The streams of the event contract (`gfair.events.subjects.STREAMS`), dead letters included.

    Storage, replication and retention are deployment choices: one file-backed replica for
    `gfair up`, three replicas on a cluster. Retention is `CONTRACT_LIMITS`; `max_age_s`, when
    given, replaces every stream's age limit.
    """
    specs = []
    for stream in STREAMS:
        limits = CONTRACT_LIMITS[stream.name]
        specs.append(
            StreamSpec(
                name=stream.name,
                subjects=stream.subjects,
                description=stream.description,
                storage=storage,
                replicas=replicas,
                duplicate_window_s=duplicate_window_s,
                max_age_s=limits.max_age_s if max_age_s is None else max_age_s,
                max_bytes=limits.max_bytes,
                max_msgs_per_subject=limits.max_msgs_per_subject,
                max_msg_size=limits.max_msg_size,
            )
        )
    return tuple(specs)


def dead_letter_stream(*, replicas: int = 1, storage: Storage = Storage.FILE) -> StreamSpec:
    (spec,) = (
        s
        for s in contract_streams(storage=storage, replicas=replicas)
        if s.name == DEAD_LETTER_STREAM
    )
    return spec


@dataclass(frozen=True, slots=True)
class Topology:
    """Everything a process needs to exist on the bus before it starts handling events."""

    streams: tuple[StreamSpec, ...] = ()
    consumers: tuple[ConsumerSpec, ...] = ()
    buckets: tuple[BucketSpec, ...] = ()

    def __post_init__(self) -> None:
        names = [s.name for s in self.streams]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"streams declared twice: {', '.join(duplicates)}")
        durables = [(c.stream, c.durable) for c in self.consumers]
        if len(set(durables)) != len(durables):
            raise ValueError("a consumer is declared twice")

    def merge(self, other: Topology) -> Topology:
        """Union of two declarations; identical repeats collapse, conflicting ones fail."""
        return Topology(
            streams=_union("stream", self.streams, other.streams, lambda s: s.name),
            consumers=_union(
                "consumer", self.consumers, other.consumers, lambda c: f"{c.stream}/{c.durable}"
            ),
            buckets=_union("bucket", self.buckets, other.buckets, lambda b: b.name),
        )


def _union(
    kind: str, left: tuple[T, ...], right: tuple[T, ...], key: Callable[[T], str]
) -> tuple[T, ...]:
    seen: dict[str, T] = {}
    for item in (*left, *right):
        name = key(item)
        if name in seen and seen[name] != item:
            raise ValueError(f"{kind} {name} declared twice with different settings")
        seen[name] = item
    return tuple(seen.values())
