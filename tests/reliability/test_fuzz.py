"""Fuzzing the live services with everything a publisher could send (issue 5, "Must show").

The five scheduler services run as in a cluster (same handlers, same runtime), on the in-memory
bus for speed and, briefly, on a real nats-server. Properties, for every input:

- no service crashes, and no handler fails: every dead letter is for an undecodable or invalid
  input, never a handler that raised or could not publish;
- every submission is answered: a contract-invalid one by a dead letter from placement (with the
  reason) and, when its user and job id can be told, a `JobRejected` for it; a valid one by
  `JobAccepted` or `JobRejected` (limits: `limit_exceeded`);
- an invalid input changes no state: every bucket (job records, stride state, nodes, profiles,
  shares, failures) holds the same keys at the same revisions.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gfair.bus.dead_letter import DeadLetterReason
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.runner import invalid_answer_id
from gfair.bus.server import EmbeddedNatsServer
from gfair.bus.transport import Bus
from gfair.events.codec import DecodedEvent, decode
from gfair.events.errors import InvalidEvent
from gfair.events.fields import TOKEN_REGEX
from gfair.events.jobs import JobAccepted, JobHeld, JobRejected
from gfair.events.reasons import RejectionCode
from gfair.events.subjects import DLQ_STREAM, JOBS_STREAM, parse_submit_subject
from gfair.state.buckets import STRIDE

from .fuzz_inputs import Input, any_events, submissions
from .live_services import NATS_FAST, LiveServices

# Tuned to keep the in-memory runs to about half a minute each on a loaded 2-core machine
# (a submission takes ~40 ms to be answered and checked, an event of any kind ~100 ms: some
# valid ones set off retries).
SUBMISSION_EXAMPLES = 500
EVENT_EXAMPLES = 300
NATS_EXAMPLES = 30
_TOKEN = re.compile(TOKEN_REGEX)
# What a dead letter may say: the input was bad. Anything else means a handler broke...
INPUT_FAULTS = {DeadLetterReason.UNDECODABLE, DeadLetterReason.INVALID}
# ... except a refusal a handler states on purpose for a valid event that contradicts what the
# services recorded (only services publish these subjects; the fuzzer forges them): split-stride
# retries a placement whose job record it cannot read yet (a replica may lag behind the
# placement that wrote it), then parks it with the reason.
STATED_REFUSALS = (("split-stride-jobs", "RuntimeError: no job record for placed job"),)
# What the fuzzing tried and what came of it, printed when a test's services stop (`-s`).
TALLY: Counter[str] = Counter()
FUZZ_SETTINGS = settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # the services deliberately outlive each example
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


def running(services: LiveServices, request: pytest.FixtureRequest) -> Iterator[LiveServices]:
    TALLY.clear()
    services.start()
    try:
        yield services
    finally:
        services.stop()
        figures = "; ".join(f"{count} {what}" for what, count in sorted(TALLY.items()))
        print(f"\n{request.node.name}: {figures}")


@pytest.fixture
def memory_services(request: pytest.FixtureRequest) -> Iterator[LiveServices]:
    async def connect() -> Bus:
        return InMemoryBus()

    yield from running(LiveServices(connect), request)


@pytest.fixture
def nats_services(
    nats_server: EmbeddedNatsServer, request: pytest.FixtureRequest
) -> Iterator[LiveServices]:
    async def connect() -> Bus:
        return await NatsBus.connect(NatsOptions(servers=(nats_server.url,), name="fuzz"))

    yield from running(LiveServices(connect, runner=NATS_FAST), request)


def judged(item: Input) -> DecodedEvent | None:
    """The event the contract makes of the input on its subject; None when it refuses it."""
    try:
        return decode(item.payload, subject=item.subject)
    except InvalidEvent:
        return None


def decoded(payload: bytes) -> DecodedEvent | None:
    try:
        return decode(payload)
    except InvalidEvent:
        return None


def recoverable_job_id(payload: bytes) -> str | None:
    """The job id a refused submission names, if it can be read and is a subject token."""
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    data = body.get("data") if isinstance(body, dict) else None
    job_id = data.get("job_id") if isinstance(data, dict) else None
    return job_id if isinstance(job_id, str) and _TOKEN.fullmatch(job_id) else None


class Exchange:
    """One input published, the services settled, and what came of it."""

    def __init__(self, services: LiveServices, item: Input) -> None:
        self.item = item
        run = services.run
        before = run(services.snapshot())
        jobs_from = run(services.last_sequence(JOBS_STREAM.name)) + 1
        letters_from = run(services.last_sequence(DLQ_STREAM.name)) + 1
        self.ack = run(services.publish_raw(item.subject, item.payload, msg_id=None))
        run(services.settle())
        self.state_before, self.state_after = before, run(services.snapshot())
        # What the services published in answer: not the input itself (which may be garbage).
        self.job_events = [
            event
            for m in run(services.messages(JOBS_STREAM.name, jobs_from))
            if m.sequence != self.ack.sequence and (event := decoded(m.data)) is not None
        ]
        self.dead_letters = run(services.dead_letters(letters_from))
        crashed = services.crashed()
        assert not crashed, f"{item.how}: services died: {crashed}"
        TALLY["inputs"] += 1
        broken = [
            d
            for d in self.dead_letters
            if d.reason not in INPUT_FAULTS
            and not any(
                d.consumer == consumer and d.error.startswith(error)
                for consumer, error in STATED_REFUSALS
            )
        ]
        assert not broken, f"{item.how}: a handler failed: {[(d.reason, d.error) for d in broken]}"

    def letters_for_input(self) -> list[str]:
        return [
            d.consumer
            for d in self.dead_letters
            if d.stream == self.ack.stream and d.sequence == self.ack.sequence
        ]

    def rejections(self) -> list[tuple[str, JobRejected]]:
        return [(e.envelope.id, e.data) for e in self.job_events if isinstance(e.data, JobRejected)]


def check_submission(services: LiveServices, item: Input) -> None:
    exchange = Exchange(services, item)
    event = judged(item)
    user = parse_submit_subject(item.subject)
    if event is None:
        assert "placement-jobs" in exchange.letters_for_input(), (
            f"{item.how}: refused without a dead letter from placement"
        )
        TALLY["invalid submissions (each dead-lettered with its reason)"] += 1
        job_id = recoverable_job_id(item.payload)
        answers = exchange.rejections()
        if job_id is None:
            assert answers == [], f"{item.how}: answered a submission naming no job"
        else:
            subject = f"gfair.job.{user}.{job_id}.rejected"
            expected_id = invalid_answer_id(
                exchange.ack.stream, exchange.ack.sequence, 0, JobRejected.EVENT_TYPE, subject
            )
            assert [(i, r.user, r.job_id) for i, r in answers] == [(expected_id, user, job_id)], (
                f"{item.how}: expected one rejection for {user}/{job_id}, got {answers}"
            )
            assert answers[0][1].code in (RejectionCode.INVALID, RejectionCode.USER_MISMATCH)
            TALLY["invalid submissions also answered with JobRejected"] += 1
        assert exchange.state_after == exchange.state_before, f"{item.how}: state changed"
        return
    # A valid submission is answered by placement, as a result of this very envelope: held
    # when it names (in `after_ok`) a job of its user's that an earlier example left unfinished.
    answers = [
        e.data
        for e in exchange.job_events
        if e.envelope.causation_id == event.envelope.id
        and isinstance(e.data, JobAccepted | JobHeld | JobRejected)
    ]
    assert answers, f"{item.how}: a valid submission went unanswered"
    TALLY["valid submissions (each accepted, held or rejected)"] += 1
    if item.how == "limits":
        assert isinstance(answers[0], JobRejected)
        assert answers[0].code is RejectionCode.LIMIT_EXCEEDED, answers[0]
        TALLY["valid submissions over a limit (rejected, limit_exceeded)"] += 1
    # A rejected job never reaches split-stride; an accepted one joins its record (no node is
    # registered, so it is never placed).
    if isinstance(answers[0], JobRejected):
        assert exchange.state_after[STRIDE.name] == exchange.state_before[STRIDE.name]


def check_any_event(services: LiveServices, item: Input) -> None:
    exchange = Exchange(services, item)
    if judged(item) is None:
        assert exchange.state_after == exchange.state_before, f"{item.how}: state changed"
        TALLY["invalid events (no state changed)"] += 1
    else:
        TALLY["valid events"] += 1


@pytest.mark.slow
@settings(FUZZ_SETTINGS, max_examples=SUBMISSION_EXAMPLES)
@given(item=submissions())
def test_every_bad_submission_is_answered_and_changes_nothing(
    memory_services: LiveServices, item: Input
) -> None:
    check_submission(memory_services, item)


@pytest.mark.slow
@settings(FUZZ_SETTINGS, max_examples=EVENT_EXAMPLES)
@given(item=any_events())
def test_no_event_of_any_type_valid_or_mangled_breaks_a_service(
    memory_services: LiveServices, item: Input
) -> None:
    check_any_event(memory_services, item)


@pytest.mark.nats
@settings(FUZZ_SETTINGS, max_examples=NATS_EXAMPLES)
@given(item=st.one_of(submissions(), any_events()))
def test_fuzzing_on_a_real_nats_server(nats_services: LiveServices, item: Input) -> None:
    if item.subject.startswith("gfair.submit."):
        check_submission(nats_services, item)
    else:
        check_any_event(nats_services, item)
