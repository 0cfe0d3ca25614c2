"""Issue 23, hole 4: a tenant squats the id of a service's event.

JetStream drops a message whose `Nats-Msg-Id` it has stored in the duplicate window, whoever
published it, and a tenant's submissions and cancellations go into the same stream as the
services' job events. Were a service's event id a function of what the tenant can read, the
tenant could publish first under it and have the service's event dropped. With the cluster's
secret (`GFAIR_EVENT_ID_KEY`) the ids are keyed and unpredictable.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gfair.bus import publisher
from gfair.bus.publisher import EVENT_ID_KEY_VARIABLE, derived_event_id
from gfair.bus.runtime import ServiceRuntime
from gfair.core.throughput import ThroughputEstimator
from gfair.embedded_cluster import EVENT_ID_KEY_FILE, event_id_key
from gfair.events.codec import encode
from gfair.events.envelope import Envelope
from gfair.events.jobs import JobAccepted, JobLaunch
from gfair.events.submission import JobSubmitted
from gfair.state import buckets
from gfair.state.job_record import load_job
from gfair_services.placement import PlacementService, PlacementSettings
from support.waiting import eventually
from tenancy.conftest import SERVICES_USER, Logins

from .test_attacks import services

JOBS = "GFAIR_JOBS"


def unkeyed_ids(cause_id: str, event_type: str, subject: str) -> list[str]:
    """What a tenant can compute of a service's answer to its own submission."""
    publisher._event_id_key.cache_clear()
    return [derived_event_id(cause_id, index, event_type, subject) for index in range(4)]


def test_keyed_ids_are_stable_and_differ_from_the_unkeyed_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(EVENT_ID_KEY_VARIABLE, raising=False)
    publisher._event_id_key.cache_clear()
    plain = derived_event_id("cause", 0, "gfair.job.accepted.v1", "gfair.job.a.j.accepted")
    ids = {}
    for key in ("one", "two"):
        monkeypatch.setenv(EVENT_ID_KEY_VARIABLE, key)
        publisher._event_id_key.cache_clear()
        ids[key] = derived_event_id("cause", 0, "gfair.job.accepted.v1", "gfair.job.a.j.accepted")
        again = derived_event_id("cause", 0, "gfair.job.accepted.v1", "gfair.job.a.j.accepted")
        assert again == ids[key]  # a redelivery's outputs get the same ids
    publisher._event_id_key.cache_clear()
    assert len({plain, *ids.values()}) == 3
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids.values())


@pytest.mark.nats
async def test_a_tenant_cannot_have_a_services_event_dropped_as_a_duplicate(
    logins: Logins, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(EVENT_ID_KEY_VARIABLE, raising=False)
    operator = await services(logins)
    alice = await logins.bus("alice")
    submission = Envelope.wrap(
        JobSubmitted(user="alice", job_id="squat", gpus=1, command=("python", "t.py")),
        source="alice",
    )
    accepted = JobAccepted(
        user="alice", job_id="squat", gpus=1, launch=JobLaunch(command=("true",))
    )
    squatted = unkeyed_ids(submission.id, accepted.EVENT_TYPE, accepted.subject())
    # Published first, under the ids placement's answer would have, on the tenant's own subject.
    for msg_id in squatted:
        await alice.publish("gfair.cancel.alice", b"{}", msg_id=msg_id)

    monkeypatch.setenv(EVENT_ID_KEY_VARIABLE, "a-secret-the-services-share")
    publisher._event_id_key.cache_clear()
    try:
        state = PlacementService(PlacementSettings(), ThroughputEstimator({}))
        async with ServiceRuntime(state.service(), await logins.bus(SERVICES_USER)):
            await alice.publish(submission.subject, encode(submission), msg_id=submission.id)
            kv = await operator.key_value(buckets.JOBS.name)
            await eventually(lambda: load_job(kv, "alice", "squat"), what="the job stored")

            async def announced() -> bool:
                stored = [m.subject async for m in operator.history(JOBS)]
                return accepted.subject() in stored

            await eventually(announced, 5, what=f"{accepted.subject()} stored")
    finally:
        publisher._event_id_key.cache_clear()
    assert await load_job(kv, "alice", "squat") is not None


def test_an_embedded_cluster_keeps_its_key_private_and_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "data" / EVENT_ID_KEY_FILE
    key = event_id_key(path)
    assert len(key) == 64 and int(key, 16) >= 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert event_id_key(path) == key  # a restart on the same data dir derives the same ids
    assert event_id_key(tmp_path / "other" / EVENT_ID_KEY_FILE) != key
