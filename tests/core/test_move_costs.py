"""Moves only when they pay (kernel rule 8): a job that ran, or whose checkpoint is on some
servers, starts elsewhere only when what it gains there exceeds what the move costs it."""

from __future__ import annotations

from gfair.core.cluster import parse_cluster_spec
from gfair.core.kernel import PoolState, RunnableJob, Snapshot, UserState, decide
from gfair.core.scheduler import SchedulerConfig
from gfair.core.switch_costs import SwitchCosts

from .machine_harness import JobSpec, MachineHarness

QUANTUM_S = 360.0


def _pools(spec: str) -> tuple[PoolState, ...]:
    cluster = parse_cluster_spec(spec)
    return tuple(
        PoolState(generation, cluster.by_generation(generation), rank)
        for rank, generation in enumerate(("v100", "k80"))
        if cluster.by_generation(generation)
    )


def _owed_on_the_v100(move_s: float) -> Snapshot:
    # "u"'s job ran on the K80; its user is owed a GPU-quantum of V100 share, none of K80's.
    # Two other users' jobs, never run, take what is left (one of them waits).
    shares = {"v100": 0.5, "k80": 0.5}
    users = {
        "u": UserState("u", 1, dict(shares), {"v100": 1.0, "k80": 0.0}),
        "w": UserState("w", 2, dict(shares)),
        "x": UserState("x", 3, {"v100": 0.0, "k80": 0.0}),
    }
    speeds = {"v100": 1.0, "k80": 1.0}
    jobs = {
        "u": [RunnableJob("u0", "u", 1, 1, dict(speeds), running=("k80-0",), move_s=move_s)],
        "w": [RunnableJob("w0", "w", 1, 2, dict(speeds))],
        "x": [RunnableJob("x0", "x", 1, 3, dict(speeds))],
    }
    return Snapshot(_pools("v100:1x1,k80:1x1"), users, jobs, quantum_s=QUANTUM_S)


def test_a_job_does_not_move_for_a_share_worth_less_than_the_move() -> None:
    decision = decide(_owed_on_the_v100(move_s=60.0))
    assert decision.placed["u0"] == ("k80-0",)  # stays, on its user's V100 turn
    assert decision.charged["u"] == {"v100": 1.0}
    assert decision.placed["w0"] == ("v100-0",)


def test_a_job_moves_when_the_share_it_collects_repays_the_move() -> None:
    decision = decide(_owed_on_the_v100(move_s=3.0))
    assert decision.placed["u0"] == ("v100-0",)


def _idle_v100_beside(v100_speed: float) -> Snapshot:
    # One job, which ran on the K80; the V100 is idle and nobody waits.
    users = {"u": UserState("u", 1, {"v100": 1.0, "k80": 1.0})}
    speeds = {"v100": v100_speed, "k80": 1.0}
    job = RunnableJob("u0", "u", 1, 1, speeds, running=("k80-0",), move_s=60.0)
    return Snapshot(_pools("v100:1x1,k80:1x1"), users, {"u": [job]}, quantum_s=QUANTUM_S)


def test_an_idle_faster_gpu_takes_a_job_only_when_the_speed_gain_repays_the_move() -> None:
    # 5% faster: 36 s gained over two quanta, less than the 60 s the move loses.
    assert decide(_idle_v100_beside(1.05)).placed["u0"] == ("k80-0",)
    # Three times as fast: the move repays itself many times over.
    assert decide(_idle_v100_beside(3.0)).placed["u0"] == ("v100-0",)


def _moves(costs: SwitchCosts, quanta: int = 80) -> tuple[int, dict[str, int]]:
    """Six one-job users on two V100s and two K80s: the moves over `quanta` quanta, and how
    many quanta each job ran."""
    config = SchedulerConfig(trading=False, quantum_s=QUANTUM_S)
    scheduler = MachineHarness(parse_cluster_spec("v100:1x2,k80:1x2"), {}, {}, config)
    names = [f"j{index}" for index in range(6)]
    for name in names:
        assert scheduler.submit(JobSpec(name, name, 1, costs=costs), 0).accepted
    moves = 0
    ran = dict.fromkeys(names, 0)
    for quantum in range(quanta):
        plan = scheduler.plan(quantum * QUANTUM_S)
        moves += len(plan.moved)
        for name in plan.placements:
            ran[name] += 1
    return moves, ran


def test_dear_moves_do_not_bounce_and_every_job_still_gets_its_turns() -> None:
    dear, ran = _moves(SwitchCosts(resume_s=1.0, migration_s=120.0))
    cheap, _ = _moves(SwitchCosts())
    # Cheap moves let jobs take their users' share wherever it is; dear ones are made rarely.
    assert dear * 5 <= cheap
    assert dear <= 12
    # Four GPUs among six jobs: each runs about two quanta in three.
    assert all(40 <= count <= 66 for count in ran.values()), ran


def _gang_whose_server_is_taken(also: list[RunnableJob]) -> Snapshot:
    # "g"'s 4-GPU gang left its checkpoint on v100-0, which "o1"'s jobs (more owed) keep
    # running on; "g" is owed 3 GPU-quanta of K80 share, where "o2"'s new jobs would run. A
    # move costs the gang a third of a quantum: 4/3 GPU-quanta, far less than it is owed, but
    # worth the K80 share only 20 times over (`_PATIENCE`), or once "g" has saved up all it may.
    users = {
        "g": UserState("g", 1, {"v100": 2.0, "k80": 2.0}, {"v100": 0.0, "k80": 3.0}),
        "o1": UserState("o1", 2, {"v100": 2.0, "k80": 0.0}, {"v100": 10.0}),
        "o2": UserState("o2", 3, {"v100": 0.0, "k80": 2.0}),
    }
    speeds = {"v100": 1.0, "k80": 1.0}
    gang = RunnableJob("gang", "g", 4, 1, dict(speeds), home=("v100-0",), move_s=120.0)
    jobs = {
        "g": [gang, *also],
        "o1": [
            RunnableJob(f"o1-{i}", "o1", 1, 10 + i, dict(speeds), running=("v100-0",))
            for i in range(4)
        ],
        "o2": [RunnableJob(f"o2-{i}", "o2", 1, 20 + i, dict(speeds)) for i in range(4)],
    }
    return Snapshot(_pools("v100:1x4,k80:1x4"), users, jobs, quantum_s=QUANTUM_S)


def test_a_waiting_gang_moves_once_its_user_has_lost_the_move_to_waiting() -> None:
    # All "g" asks is its share: what it is owed while the gang waits cannot be spent later,
    # so waiting loses it; the gang moves once that loss covers the move.
    decision = decide(_gang_whose_server_is_taken([]))
    assert decision.placed["gang"] == ("k80-0",)
    assert all(f"o1-{i}" in decision.placed for i in range(4))


def test_a_waiting_gang_of_a_user_asking_more_than_its_share_saves_up() -> None:
    # A fifth GPU asked (a job that runs on V100s only): "g" will run beyond its share later
    # with what it is owed now, so the dear move waits until it has saved up all it may.
    v100_only = RunnableJob("v100-only", "g", 1, 2, {"v100": 1.0, "k80": 0.0}, pass_=1.0)
    decision = decide(_gang_whose_server_is_taken([v100_only]))
    assert "gang" not in decision.placed
    assert sorted(decision.runs["k80-0"]) == [f"o2-{i}" for i in range(4)]
