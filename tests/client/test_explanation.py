"""`gfair why`: the reasons put together from placement's, split-stride's, the auction's and the
failure detector's records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gfair.client.explanation import Explanation, explain
from gfair.client.views import JobDetails
from gfair.events.reasons import FailureClass, RejectionCode
from gfair.events.states import JobState, NodeState
from gfair.state.job_record import JobRecord, Submission
from gfair.state.node_record import NodeRecord
from gfair.state.share_record import AccountShare, PoolShare, SharesRecord, UserShare
from gfair.state.stride_record import (
    Residency,
    ResidencyPhase,
    ServerRecord,
    StrideJob,
    StrideRecord,
    StrideUser,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def record(job_id: str, gpus: int, state: JobState, **fields: object) -> JobRecord:
    submission = Submission(event_id=f"e-{job_id}", submitted_at=NOW, gpus=gpus, command=("x",))
    values: dict[str, object] = {
        "user": "alice",
        "job_id": job_id,
        "state": state,
        "submission": submission,
        "created_at": NOW,
        "updated_at": NOW,
    }
    return JobRecord.model_validate(values | fields)


def stride(*, runnable_at: datetime | None = None) -> StrideRecord:
    """v100-0 (4 GPUs): bob/b1 runs on 3 of them; alice/wide (2 GPUs) last ran there and waits
    behind alice/first, which has a lower pass."""
    return StrideRecord(
        epoch="e",
        usage_since=NOW,
        updated_at=NOW,
        users={
            "alice": StrideUser(seq=1, credit={"v100": -0.5}),
            "bob": StrideUser(seq=2, credit={"v100": 1.25}),
        },
        servers={
            "v100-0": ServerRecord(
                node_id="v100-0", generation="v100", gpu_indices=(0, 1, 2, 3), changed_at=NOW
            )
        },
        jobs={
            "bob.b1": StrideJob(
                user="bob",
                job_id="b1",
                gpus=3,
                weight=1.0,
                servers=("v100-0",),
                residency=(
                    Residency(
                        node_id="v100-0",
                        phase=ResidencyPhase.RUNNING,
                        attempt=1,
                        gpu_indices=(0, 1, 2),
                        since=NOW,
                        quantum=3,
                    ),
                ),
            ),
            "alice.wide": StrideJob(
                user="alice",
                job_id="wide",
                gpus=2,
                weight=1.0,
                seq=4,
                stride_pass=2.5,
                servers=("v100-0",),
                attempt=2,
                runnable_at=runnable_at,
            ),
            "alice.first": StrideJob(
                user="alice", job_id="first", gpus=1, weight=1.0, seq=3, stride_pass=1.0
            ),
        },
    )


SHARES = SharesRecord(
    revision=1,
    computed_at=NOW,
    min_seller_gain=0.1,
    capacity={"v100": 4},
    users={
        "alice": UserShare(
            user="alice",
            tickets=1,
            jobs=3,
            demand=4,
            pools={"v100": PoolShare(fair=2, entitled=2)},
            throughput_fair=2,
            throughput_entitled=2,
        )
    },
)


def why(job: JobRecord, **context: object) -> Explanation:
    details = JobDetails(user=job.user, job_id=job.job_id, record=job, events=())
    arguments: dict[str, object] = {"stride": None, "shares": None, "nodes": []} | context
    return explain(details, now=NOW, **arguments)  # type: ignore[arg-type]


def kinds(explanation: Explanation) -> dict[str, str]:
    return {r.kind: r.text for r in explanation.reasons if r.kind != "history"}


def test_jobs_ahead_with_the_same_pass_are_said_to_be_submitted_earlier() -> None:
    tied = stride()
    tied.jobs["alice.wide"] = tied.jobs["alice.wide"].model_copy(update={"stride_pass": 0.0})
    tied.jobs["alice.first"] = tied.jobs["alice.first"].model_copy(update={"stride_pass": 0.0})
    job = record("wide", 2, JobState.PLACED, servers=("v100-0",), generation="v100")
    reasons = [r.text for r in why(job, stride=tied, shares=SHARES).reasons]
    ahead = next(r for r in reasons if "come before it" in r)
    assert "1 with the same pass, submitted earlier" in ahead
    assert "vs its" not in ahead and "lower pass" not in ahead


def test_a_waiting_gang_sees_its_pass_the_gpus_held_and_its_share() -> None:
    job = record("wide", 2, JobState.PLACED, servers=("v100-0",), generation="v100")
    found = why(job, stride=stride(), shares=SHARES)
    assert found.headline == "alice/wide is placed and waits for GPUs"
    reasons = [r.text for r in found.reasons]
    assert any("1 of alice's other jobs come before it: 1 with a lower pass (from 1; its is "
               "2.5)" in r for r in reasons)  # fmt: skip
    assert any("alice's credit per pool, in GPU-quanta" in r and "v100 -0.5" in r for r in reasons)
    assert any("needs 2 GPUs at once; v100-0, where it last ran, has 1 of 4 free, held by "
               "bob/b1 (3)" in r for r in reasons)  # fmt: skip
    assert "entitled to 2.00 GPUs (v100 2.00)" in kinds(found)["share"]
    assert "take turns" in kinds(found)["share"]


def test_a_retried_job_waits_out_its_back_off() -> None:
    job = record(
        "wide",
        2,
        JobState.QUEUED,
        servers=("v100-0",),
        failure_class=FailureClass.INFRASTRUCTURE,
        reason="node v100-1 lost",
    )
    found = why(job, stride=stride(runnable_at=NOW + timedelta(seconds=40)))
    backoff = kinds(found)["backoff"]
    assert "attempt 2 may start in 40s" in backoff
    assert "after infrastructure: node v100-1 lost" in backoff


def test_a_job_split_stride_lacks_and_a_quarantined_server_are_named() -> None:
    queued = record("p", 8, JobState.QUEUED)
    assert "split-stride has not taken it in yet" in kinds(why(queued))["stride"]
    placed = record("q", 1, JobState.PLACED, servers=("v100-0",))
    node = NodeRecord(
        node_id="v100-0",
        state=NodeState.QUARANTINED,
        state_since=NOW,
        quarantined=True,
        quarantine_reason="3 infrastructure failures in 10 min",
    )
    text = kinds(why(placed, nodes=[node]))["node"]
    assert "v100-0 is quarantined: 3 infrastructure failures" in text
    assert "gfair nodes uncordon" in text


def test_finished_jobs_say_how_they_ended() -> None:
    rejected = record(
        "r", 64, JobState.REJECTED, rejection_code=RejectionCode.UNSATISFIABLE, reason="too big"
    )
    assert why(rejected).headline == "alice/r was rejected (unsatisfiable): too big"
    failed = record("f", 1, JobState.FAILED, failure_class=FailureClass.USER_ERROR, reason="exit 1")
    found = why(failed, shares=SHARES)
    assert found.headline == "alice/f failed (user_error): exit 1"
    assert "share" not in kinds(found)  # over: its share no longer matters


def test_with_accounts_each_level_is_named_and_the_one_that_holds_the_user_back() -> None:
    tree = SHARES.model_copy(
        update={
            "accounts": {
                "research": AccountShare(tickets=3, fair=3.0, demand=9),
                "research/vision": AccountShare(tickets=1, fair=2.5, demand=5),
            },
            "members": {"alice": "research/vision"},
        }
    )
    job = record("wide", 2, JobState.PLACED, servers=("v100-0",), generation="v100")
    found = [r.text for r in why(job, stride=stride(), shares=tree).reasons if r.kind == "account"]
    assert found == [
        "its account research/vision (1 tickets) holds 2.50 GPUs of fair share; its users ask 5",
        "its account research (3 tickets) holds 3.00 GPUs of fair share; its users ask 9",
        "held back at account research: it asks 9 GPUs, more than its 3.00 of fair share",
    ]
    # A user within its share is held back by nothing, whatever its accounts ask.
    content = tree.model_copy(
        update={"users": {"alice": SHARES.users["alice"].model_copy(update={"demand": 2})}}
    )
    found = [r.text for r in why(job, stride=stride(), shares=content).reasons]
    assert not any(r.startswith("held back") for r in found)
    # Without a shares file, no account is named.
    assert not [r for r in why(job, stride=stride(), shares=SHARES).reasons if r.kind == "account"]
