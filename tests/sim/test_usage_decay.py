"""The decayed mode through the simulator (docs/design.md §1.1, docs/simulation.md): the worked
example of issue 25 in numbers, on what the simulated cluster ran quantum by quantum.

8 V100s, quanta of 60 s, half-life 1 h; `a` and `b` one ticket each, sixteen 1-GPU jobs each
that outlast the run. `a` runs alone for an hour (a half-life), then `b` arrives and both stay
backlogged for three more hours.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.shares_file import parse_shares
from gfair.core.shares_tree import ShareTree
from gfair.core.throughput import ThroughputTable
from gfair.sim.gandiva_fair_machine import GandivaFairMachine
from gfair.sim.replay import ReplayOptions, build_policy, replay
from gfair.sim.simulator import SimConfig, Simulator
from gfair.sim.speed import SpeedModel

from .workloads import Row, trace_of

HOUR = 3600.0
QUANTUM = 60.0
CLUSTER = "v100:2x4"
GPUS = 8
END = 4 * HOUR
DECAYED = parse_shares("fairness = 'decayed'\nhalf_life = '1h'\n")
TRACE = trace_of(
    [Row(0.0, "a", 1, 1e7) for _ in range(16)] + [Row(HOUR, "b", 1, 1e7) for _ in range(16)]
)


class Held:
    """The GPUs each user held in each quantum, from the simulator's timeline (1-GPU jobs)."""

    def __init__(self) -> None:
        self.quanta: list[tuple[float, Counter[str]]] = []

    def quantum(self, now: float, runs: Mapping[str, list[str]]) -> None:
        users = Counter(TRACE.jobs[int(job)].user for jobs in runs.values() for job in jobs)
        self.quanta.append((now, users))

    def share(self, user: str, begin: float, end: float) -> float:
        """`user`'s part of the GPU-seconds held in [begin, end)."""
        held = Counter[str]()
        for now, users in self.quanta:
            if begin <= now < end:
                held.update(users)
        return held[user] / held.total()

    def decayed_share(self, user: str, at: float, half_life_s: float) -> float:
        """`user`'s part of the GPU-seconds held before `at`, each weighed by 2^(-age/half-life)
        (each quantum's exactly: the integral of the weight over it)."""
        weighed = Counter[str]()
        for now, users in self.quanta:
            if now + QUANTUM <= at:
                age = at - (now + QUANTUM)
                weight = 2 ** (-age / half_life_s) * (1 - 2 ** (-QUANTUM / half_life_s))
                for name, gpus in users.items():
                    weighed[name] += gpus * weight
        return weighed[user] / weighed.total()


def simulate(
    throughput: ThroughputTable, shares: ShareTree | None
) -> tuple[Held, GandivaFairMachine]:
    cluster = parse_cluster_spec(CLUSTER)
    options = ReplayOptions(until_s=END, shares=shares)
    speeds = SpeedModel.from_rates(throughput)
    policy = build_policy("gandiva-fair", cluster, TRACE, speeds, throughput, options)
    assert isinstance(policy, GandivaFairMachine)
    held = Held()
    config = SimConfig(quantum_s=QUANTUM, until_s=END, shares=shares)
    Simulator(TRACE, cluster, policy, speeds, config, held).run()
    assert all(sum(users.values()) == GPUS for _, users in held.quanta)  # work-conserving
    return held, policy


def test_a_user_back_from_a_half_life_idle_gets_more_until_usage_evens_out(
    throughput: ThroughputTable,
) -> None:
    held, scheduler = simulate(throughput, DECAYED)
    plain, _ = simulate(throughput, None)
    # Instantaneous: b gets its ticket share, half, from the quantum it arrives.
    assert plain.share("b", HOUR, HOUR + 1800) == pytest.approx(0.5, abs=0.01)
    # Decayed: a's hour alone weighs against it (u_a = 1, u_b = 0, weights 1/4 and 1: 6.4 of 8
    # GPUs to b at first), and b's lead shrinks as its own usage catches up.
    first = held.share("b", HOUR, HOUR + 1800)
    second = held.share("b", HOUR + 1800, 2 * HOUR)
    later = held.share("b", 3 * HOUR, END)
    assert first > 0.65
    assert first > second > later
    assert later == pytest.approx(0.5, abs=0.03)
    # What each received over the horizon, weighed by age: within 2 points of the tickets'
    # 50% two half-lives after b's return (b had none then) and after three.
    assert held.decayed_share("b", 3 * HOUR, HOUR) == pytest.approx(0.5, abs=0.02)
    assert held.decayed_share("b", END, HOUR) == pytest.approx(0.5, abs=0.02)
    assert plain.decayed_share("b", 2 * HOUR, HOUR) < 0.42  # the instantaneous mode does not
    # The scheduler's own usage is what the cluster held, weighed the same way.
    usage = scheduler.usage()
    at = held.quanta[-1][0]
    assert usage["b"] / sum(usage.values()) == pytest.approx(
        held.decayed_share("b", at, HOUR), abs=1e-6
    )


def test_tickets_one_to_three_are_tracked_and_a_half_life_change_shows(
    throughput: ThroughputTable,
) -> None:
    tree = parse_shares("fairness = 'decayed'\nhalf_life = '1h'\n[users.b]\ntickets = 3\n")
    held, _ = simulate(throughput, tree)
    assert held.share("b", HOUR, HOUR + 1800) > 0.9  # weights 1/4 and 3: 7.4 GPUs of 8
    assert held.decayed_share("b", END, HOUR) == pytest.approx(0.75, abs=0.02)
    # A longer half-life remembers a's hour longer: b's lead lasts longer.
    slow, _ = simulate(throughput, parse_shares("fairness = 'decayed'\nhalf_life = '4h'\n"))
    fast, _ = simulate(throughput, DECAYED)
    assert slow.share("b", 2 * HOUR, 3 * HOUR) > fast.share("b", 2 * HOUR, 3 * HOUR)


def test_without_decay_the_scheduler_keeps_no_usage_and_decides_as_before(
    throughput: ThroughputTable,
) -> None:
    held, scheduler = simulate(throughput, parse_shares("fairness = 'instantaneous'\n"))
    plain, _ = simulate(throughput, None)
    assert scheduler.usage() == {}
    assert held.quanta == plain.quanta
    # A user that finishes early leaves the rest settled: the plain mode skips those quanta,
    # the decayed mode (its weights move with usage) decides every one.
    trace = trace_of([Row(0.0, "a", 1, 600.0), Row(0.0, "b", 1, 3 * HOUR)])
    cluster = parse_cluster_spec(CLUSTER)
    runs = {
        name: replay(trace, cluster, throughput, ReplayOptions(until_s=END, shares=tree)).result
        for name, tree in (("plain", None), ("decayed", DECAYED))
    }
    assert runs["plain"].plans < 10
    assert runs["decayed"].plans == 3 * HOUR / QUANTUM


def test_the_report_runs_in_the_decayed_mode(throughput: ThroughputTable) -> None:
    report = replay(
        TRACE, parse_cluster_spec(CLUSTER), throughput, ReplayOptions(until_s=END, shares=DECAYED)
    ).report
    # The report measures against the instantaneous entitlement: over b's active time it
    # received more than that half (the payback), a less.
    assert report.users["b"].received_share > 0.5 + 0.02
    assert math.isclose(report.users["b"].entitled_share, 0.5)
