"""The paper's split stride as a simulator baseline (`gfair.sim.policies.paper_split_stride`):
homes, a stride per server, a central stride for gangs spanning servers, load balancing."""

from __future__ import annotations

from collections import Counter

from gfair.core.cluster import parse_cluster_spec
from gfair.sim.policies.paper_split_stride import PaperSplitStride
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import TraceJob


def job(job_id: str, user: str, gpus: int = 1) -> TraceJob:
    return TraceJob(job_id, user, gpus, 0.0, 1e9)


def quanta(policy: PaperSplitStride, count: int) -> Counter[str]:
    """Quanta each job held GPUs in, over `count` decisions."""
    ran: Counter[str] = Counter()
    for n in range(count):
        for jobs in policy.plan(n * 60.0).runs.values():
            ran.update(jobs)
    return ran


def test_users_share_a_server_by_their_tickets_split_among_their_jobs(
    speeds: SpeedModel,
) -> None:
    cluster = parse_cluster_spec("v100:1x2")
    policy = PaperSplitStride(cluster, speeds, {"ann": 2.0, "bob": 1.0})
    for spec in (job("a1", "ann"), job("a2", "ann"), job("b1", "bob"), job("b2", "bob")):
        assert policy.submit(spec, 0.0).accepted
    ran = quanta(policy, 60)
    assert sum(ran.values()) == 120  # both GPUs every quantum
    assert ran["a1"] + ran["a2"] == 80  # ann's 2 tickets of 3
    assert abs(ran["a1"] - ran["a2"]) <= 1 and abs(ran["b1"] - ran["b2"]) <= 1


def test_jobs_are_homed_where_there_is_room_and_idle_gpus_take_jobs_from_crowded_servers(
    speeds: SpeedModel,
) -> None:
    cluster = parse_cluster_spec("v100:2x2")
    policy = PaperSplitStride(cluster, speeds, {})
    for n in range(6):
        policy.submit(job(f"j{n}", f"u{n}"), 0.0)
    homes = Counter(servers for servers in policy.homes().values())
    assert homes == {("v100-0",): 3, ("v100-1",): 3}  # room first, then the least loaded
    first = [j for j, servers in policy.homes().items() if servers == ("v100-0",)]
    for job_id in first:
        policy.finish(job_id, 60.0)
    runs = policy.plan(60.0).runs  # one of v100-1's three jobs moves to the idle server
    assert sorted(len(jobs) for jobs in runs.values()) == [1, 2]
    # Nobody waits any more: nothing moves again.
    placed = dict(policy.homes())
    quanta(policy, 5)
    assert dict(policy.homes()) == placed


def test_a_gang_larger_than_a_server_takes_whole_servers_in_turn_with_their_jobs(
    speeds: SpeedModel,
) -> None:
    cluster = parse_cluster_spec("v100:2x4")
    policy = PaperSplitStride(cluster, speeds, {})
    policy.submit(job("gang", "ann", 8), 0.0)
    policy.submit(job("solo", "bob", 1), 0.0)
    decisions = [policy.plan(n * 60.0).runs for n in range(9)]
    for runs in decisions:
        if "gang" in runs.get("v100-0", ()):
            assert runs == {"v100-0": ("gang",), "v100-1": ("gang",)}
    gang_quanta = sum("gang" in runs.get("v100-0", ()) for runs in decisions)
    # Equal tickets: a quantum the gang wins costs it its 8 GPUs, one the one-GPU job's server
    # wins costs that server's 4 (the central stride's entry for it): the gang runs one in 3.
    assert gang_quanta == 3
    assert all(runs == {"v100-0": ("solo",)} for runs in decisions if "v100-1" not in runs)


def test_a_job_no_generation_can_hold_is_refused(speeds: SpeedModel) -> None:
    policy = PaperSplitStride(parse_cluster_spec("v100:2x4,k80:1x4"), speeds, {})
    admission = policy.submit(job("huge", "ann", 12), 0.0)
    assert not admission.accepted and "12 GPUs" in admission.reason


def test_a_gang_moves_to_faster_servers_once_nobody_asks_for_them(speeds: SpeedModel) -> None:
    policy = PaperSplitStride(parse_cluster_spec("v100:2x4,k80:2x4"), speeds, {})
    resnet = "ResNet-50 (batch size 128)"  # about 5x faster on a V100 than on a K80
    for n in range(2):
        policy.submit(TraceJob(f"solo{n}", "bob", 1, 0.0, 1e9, resnet), 0.0)
    gang = TraceJob("gang", "ann", 8, 0.0, 1e9, resnet)
    policy.submit(gang, 0.0)
    assert policy.homes()["gang"] == ("k80-0", "k80-1")  # the V100s were asked for
    for n in range(2):
        policy.finish(f"solo{n}", 60.0)
    runs = policy.plan(60.0).runs
    assert policy.homes()["gang"] == ("v100-0", "v100-1")
    assert runs == {"v100-0": ("gang",), "v100-1": ("gang",)}
