"""A job's time limit (`gfair submit --time-limit`): the machine ends a job once its running
time, holding GPUs, passes it; time waiting or time-sliced out does not count."""

from __future__ import annotations

from gfair.core.scheduler import Admitted, Ended, Launch, SplitStride, TimedOut
from gfair.core.scheduler.residency import duration

from .test_split_stride import QUANTUM_S, admit, machine, only_start, started, suspended


def admit_limited(m: SplitStride, user: str, job_id: str, now: float, limit_s: float) -> None:
    launch = Launch(("train",), {}, time_limit=limit_s)
    reply = m.apply(
        Admitted(
            user=user, job_id=job_id, now=now, gpus=1, weight=1.0, job_type=None, launch=launch
        )
    )
    for start in (s for turn in reply.starts.turns for s in turn.starts):
        started(m, start, now)


def quanta(m: SplitStride, count: int) -> list[tuple[float, tuple[TimedOut, ...]]]:
    """`count` ticks a quantum apart, every command confirmed at once; each tick's time and
    the jobs it ended."""
    ended = []
    for quantum in range(1, count + 1):
        now = QUANTUM_S * quantum
        plan = m.tick(now)
        for turn in plan.turns:
            for stop in turn.stops:
                suspended(m, stop, now)
            for start in turn.starts:
                started(m, start, now)
        ended.append((now, plan.timed_out))
    return ended


def test_a_job_time_sliced_with_another_is_ended_by_its_running_time_not_the_wall_clock() -> None:
    m = machine(("v100-0", 1))
    admit_limited(m, "alice", "a", 0.0, limit_s=150.0)  # runs at once
    admit(m, "bob", "b", 0.0)  # waits: the two take turns on the one GPU
    ticks = quanta(m, 6)
    (when,) = [now for now, ended in ticks if ended]
    # It ran every other quantum: 150 s of running time take about 300 s of wall time.
    assert when >= 2 * 150.0 - QUANTUM_S
    job = ticks[[now for now, _ in ticks].index(when)][1][0]
    assert (job.user, job.job_id, job.attempt) == ("alice", "a", 1)
    assert job.reason.startswith("time limit 2m30s reached after ")
    assert job.reason.endswith(" running")
    assert "alice.a" not in m.jobs
    # What it held, if anything, is killed, with the reason.
    assert all(kill.kill and kill.reason == job.reason for kill in job.kills)
    # Bob's job, limitless, runs on.
    assert m.jobs["bob.b"].stays


def test_a_job_on_gpus_is_ended_at_the_first_tick_past_its_limit_and_its_gpus_freed() -> None:
    m = machine(("v100-0", 1))
    admit_limited(m, "alice", "a", 0.0, limit_s=100.0)
    assert not m.tick(QUANTUM_S).timed_out
    assert m.jobs["alice.a"].running_s(QUANTUM_S) == QUANTUM_S
    (ended,) = m.tick(2 * QUANTUM_S).timed_out
    assert ended.reason == "time limit 1m40s reached after 2m running"
    (kill,) = ended.kills
    assert (kill.node_id, kill.attempt, kill.kill) == ("v100-0", 1, True)
    assert not m.jobs and m.index.free_gpus() == 1
    # Its end, heard back from the driver's event, changes nothing more.
    assert not m.apply(Ended(user="alice", job_id="a", now=121.0, state="failed")).changed


def test_a_job_with_no_limit_or_under_it_is_never_ended() -> None:
    m = machine(("v100-0", 2))
    admit_limited(m, "alice", "a", 0.0, limit_s=10 * QUANTUM_S)
    start = only_start(admit(m, "bob", "b", 0.0).starts.turns)
    started(m, start, 0.0)
    assert not any(ended for _, ended in quanta(m, 5))
    assert m.jobs["alice.a"].running_s(5 * QUANTUM_S) == 5 * QUANTUM_S


def test_durations_read_as_a_person_writes_them() -> None:
    assert [duration(s) for s in (45, 90, 14400, 14412, 5400, 183600, 0)] == [
        "45s",
        "1m30s",
        "4h",
        "4h00m12s",
        "1h30m",
        "2d03h",
        "0s",
    ]
