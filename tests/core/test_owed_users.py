"""An owed user gets its GPUs whatever the other tenant's jobs do (issue 23, item 3): the GPU
time a job holds past its yield is charged to its user (`kernel.settle`'s overrun), and a job
whose user's share is split among pools stays where it runs while its user is owed there
(`kernel._kept_in`) instead of moving every quantum."""

from __future__ import annotations

import itertools

from gfair.core.cluster import parse_cluster_spec
from gfair.core.kernel import Decision, UserState, settle
from gfair.core.scheduler import GandivaFair, JobSpec
from gfair.gavel import load_throughputs


def test_settle_charges_the_gpu_time_held_past_a_yield_even_in_an_unbooked_quantum() -> None:
    users = {
        "alice": UserState("alice", 1, {"v100": 3.0}, {"v100": 2.0}),
        "bob": UserState("bob", 2, {"v100": 1.0}, {"v100": 1.0}),
    }
    decided = Decision(runs={}, placed={}, charged={"bob": {"v100": 1.0}}, waiting=1)
    ceiling = {"alice": 4.0, "bob": 1.0}
    # Alice's gang held 4 GPUs for 2 s of a 3 s quantum after it was told to stop.
    assert settle(users, [], decided, ceiling, {"alice": {"v100": 4 * 2 / 3}})
    assert users["alice"].credit["v100"] == 2.0 + 3.0 - 8 / 3
    assert users["bob"].credit["v100"] == 1.0 + 1.0 - 1.0
    # Nobody waits now, but the GPUs were denied to someone when they were held: charged.
    idle = Decision(runs={}, placed={}, charged={}, waiting=0)
    assert not settle(users, [], idle, ceiling, {"alice": {"v100": 1.0}})
    assert users["alice"].credit["v100"] == 2.0 + 3.0 - 8 / 3 - 1.0


def _bob_beside_whole_server_gangs(quanta: int) -> list[tuple[str, ...] | None]:
    """Where bob's 1-GPU job runs each quantum after it arrives beside alice's four 4-GPU
    gangs on one 4-GPU server of each of two pools (None: it waits)."""
    cluster = GandivaFair(parse_cluster_spec("v100:1x4,k80:1x4"), {}, load_throughputs())
    for index in range(4):
        assert cluster.submit(JobSpec(f"a{index}", "alice", 4), 0).accepted
    for quantum in range(10):
        cluster.plan(quantum)
    assert cluster.submit(JobSpec("b", "bob", 1), 10).accepted
    return [cluster.plan(10 + q).placements.get("b") for q in range(quanta)]


def test_an_owed_users_job_stays_where_it_runs_instead_of_moving_every_quantum() -> None:
    where = _bob_beside_whole_server_gangs(40)
    # Bob runs within two quanta of arriving.
    assert any(servers is not None for servers in where[:2])
    ran = [servers for servers in where if servers is not None]
    moves = sum(1 for before, after in itertools.pairwise(ran) if before != after)
    # Bob's share is half a GPU of each pool: before, his job ran in whichever pool his credit
    # was higher, which running there made the other, and moved nearly every quantum (30
    # moves in 31 runs), each a checkpoint and restore and, live, a gang forced off.
    assert len(ran) >= 25
    assert moves <= len(ran) // 2
