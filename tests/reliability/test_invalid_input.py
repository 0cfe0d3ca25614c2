"""Bad input is answered, not only dead-lettered (issue 5, part 1).

A submission the event contract refuses never reaches placement's handler; the runtime answers
it through the route's `on_invalid` hook (a `JobRejected` for the user of the subject, when the
job id can be read) and then dead-letters it with the reason. Nothing else changes.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from gfair.bus.dead_letter import DeadLetter, DeadLetterReason
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.publisher import EventPublisher
from gfair.bus.runner import invalid_answer_id
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, InvalidInput, Service
from gfair.bus.topology import DEAD_LETTER_STREAM
from gfair.core.throughput import ThroughputEstimator
from gfair.events.codec import decode
from gfair.events.jobs import JobAccepted, JobRejected, JobStarted
from gfair.events.reasons import RejectionCode
from gfair.events.subjects import JOBS_STREAM
from gfair.events.submission import JobCancelRequested, JobSubmitted
from gfair.state.buckets import JOBS
from gfair_services.placement import PlacementService, PlacementSettings
from gfair_services.topology import cluster_topology

from .live_services import FAST

COMMAND = ["python", "-c", "pass"]


def envelope(
    data: dict[str, Any], subject: str, event_type: str = JobSubmitted.EVENT_TYPE
) -> bytes:
    body = {
        "id": uuid.uuid4().hex,
        "type": event_type,
        "source": "test",
        "time": datetime.now(UTC).isoformat(),
        "subject": subject,
        "data": data,
    }
    return json.dumps(body).encode()


class Placement:
    """Placement alone on an in-memory bus, and what it published."""

    def __init__(self, bus: InMemoryBus, state: PlacementService) -> None:
        self.bus = bus
        self.state = state

    async def send(self, subject: str, payload: bytes) -> int:
        return (await self.bus.publish(subject, payload)).sequence

    def rejections(self) -> list[tuple[str, JobRejected]]:
        found = []
        for message in self.bus.stream_messages(JOBS_STREAM.name):
            if message.subject.endswith(".rejected"):
                event = decode(message.data)
                assert isinstance(event.data, JobRejected)
                found.append((event.envelope.id, event.data))
        return found

    def dead_letters(self) -> list[DeadLetter]:
        return [
            DeadLetter.model_validate_json(m.data)
            for m in self.bus.stream_messages(DEAD_LETTER_STREAM)
        ]

    async def answered(self, sequence: int, timeout_s: float = 5.0) -> DeadLetter:
        """The dead letter of the input stored at `sequence` (once it was handled)."""
        for _ in range(int(timeout_s / 0.01)):
            for letter in self.dead_letters():
                if letter.sequence == sequence and letter.consumer == "placement-jobs":
                    return letter
            await asyncio.sleep(0.01)
        raise AssertionError(f"input {sequence} was never dead-lettered")

    async def records(self) -> list[str]:
        return sorted(await (await self.bus.key_value(JOBS.name)).keys())


@pytest.fixture
async def placement() -> AsyncIterator[Placement]:
    bus = InMemoryBus()
    state = PlacementService(PlacementSettings(max_job_gpus=8), ThroughputEstimator({}))
    async with ServiceRuntime(state.service(), bus, settings=FAST):
        yield Placement(bus, state)


async def test_an_invalid_submission_is_rejected_for_its_job_and_dead_lettered(
    placement: Placement,
) -> None:
    data = {"user": "alice", "job_id": "j1", "gpus": 0, "command": COMMAND}
    sequence = await placement.send("gfair.submit.alice", envelope(data, "gfair.submit.alice"))
    letter = await placement.answered(sequence)
    (answer,) = placement.rejections()
    event_id, rejected = answer
    assert (rejected.user, rejected.job_id, rejected.code) == ("alice", "j1", RejectionCode.INVALID)
    assert "data.gpus" in rejected.reason and "greater than or equal to 1" in rejected.reason
    # A redelivery answers under the same id, which the stream's dedup window drops.
    subject = "gfair.job.alice.j1.rejected"
    assert event_id == invalid_answer_id(
        JOBS_STREAM.name, sequence, 0, JobRejected.EVENT_TYPE, subject
    )
    assert letter.reason is DeadLetterReason.INVALID and "data.gpus" in letter.error
    assert await placement.records() == []  # no record: the job never existed


async def test_a_payload_for_another_user_is_answered_in_the_submitters_namespace(
    placement: Placement,
) -> None:
    forged = {"user": "bob", "job_id": "j1", "gpus": 1, "command": COMMAND}
    sequence = await placement.send("gfair.submit.alice", envelope(forged, "gfair.submit.alice"))
    await placement.answered(sequence)
    ((_, rejected),) = placement.rejections()
    assert (rejected.user, rejected.job_id) == ("alice", "j1")
    assert rejected.code is RejectionCode.USER_MISMATCH
    assert await placement.records() == []


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"\xff\xfe not json", "undecodable"),
        (b'{"data": {"job_id": "a.b"}}', "a job id that is no subject token"),
        (b'{"data": {"user": "alice"}}', "no job id"),
    ],
)
async def test_a_submission_naming_no_usable_job_is_answered_by_its_dead_letter_alone(
    placement: Placement, payload: bytes, why: str
) -> None:
    sequence = await placement.send("gfair.submit.alice", payload)
    letter = await placement.answered(sequence)
    assert letter.reason in (DeadLetterReason.UNDECODABLE, DeadLetterReason.INVALID), why
    assert letter.error
    assert placement.rejections() == [], why


async def test_another_kind_of_event_on_a_submission_subject_is_refused_not_skipped(
    placement: Placement,
) -> None:
    # Placement takes `started` reports, but never from a submission subject.
    started = {"user": "alice", "job_id": "j2", "node_id": "n1", "gpu_indices": [0], "attempt": 1}
    payload = envelope(started, "gfair.submit.alice", JobStarted.EVENT_TYPE)
    sequence = await placement.send("gfair.submit.alice", payload)
    letter = await placement.answered(sequence)
    assert letter.reason is DeadLetterReason.INVALID
    ((_, rejected),) = placement.rejections()
    assert (rejected.job_id, rejected.code) == ("j2", RejectionCode.INVALID)


async def test_a_bad_cancel_is_dead_lettered_without_announcing_the_jobs_end(
    placement: Placement,
) -> None:
    cancel = {"user": "alice", "job_id": "j1", "reason": ""}  # an empty reason is invalid
    payload = envelope(cancel, "gfair.cancel.alice", JobCancelRequested.EVENT_TYPE)
    sequence = await placement.send("gfair.cancel.alice", payload)
    letter = await placement.answered(sequence)
    assert letter.reason is DeadLetterReason.INVALID and "data.reason" in letter.error
    assert placement.rejections() == []


async def test_limits_are_refused_with_their_own_code_and_valid_jobs_still_pass(
    placement: Placement,
) -> None:
    tool = EventPublisher(placement.bus, "test")
    await tool.publish(JobSubmitted(user="alice", job_id="big", gpus=9, command=tuple(COMMAND)))
    await tool.publish(JobSubmitted(user="alice", job_id="ok", gpus=8, command=tuple(COMMAND)))
    for _ in range(500):
        if any(
            m.subject.endswith(".accepted") for m in placement.bus.stream_messages("GFAIR_JOBS")
        ):
            break
        await asyncio.sleep(0.01)
    ((_, rejected),) = placement.rejections()
    assert (rejected.job_id, rejected.code) == ("big", RejectionCode.LIMIT_EXCEEDED)
    assert "at most 8" in rejected.reason
    accepted = [
        decode(m.data).data
        for m in placement.bus.stream_messages(JOBS_STREAM.name)
        if m.subject.endswith(".accepted")
    ]
    assert [a.job_id for a in accepted if isinstance(a, JobAccepted)] == ["ok"]


async def test_a_failing_answer_hook_still_dead_letters_the_input() -> None:
    bus = InMemoryBus()
    service = Service("hooked", topology=cluster_topology())
    handled: list[str] = []

    def broken_hook(invalid: InvalidInput) -> Sequence[Emit]:
        raise ValueError(f"cannot answer {invalid.subject}")

    async def on_submit(envelope: Any, data: JobSubmitted) -> list[Emit]:
        handled.append(data.job_id)
        return []

    service.add_handler(on_submit, durable="hooked", on_invalid=broken_hook, ack_wait_s=2.5)
    (route,) = service.routes
    assert route.consumer.ack_wait_s == 2.5
    async with ServiceRuntime(service, bus, settings=FAST):
        sequence = (await bus.publish("gfair.submit.alice", b"garbage")).sequence
        for _ in range(500):
            letters = bus.stream_messages(DEAD_LETTER_STREAM)
            if letters:
                break
            await asyncio.sleep(0.01)
    (letter,) = [DeadLetter.model_validate_json(m.data) for m in letters]
    assert (letter.sequence, letter.reason) == (sequence, DeadLetterReason.UNDECODABLE)
    assert handled == []
