"""`CarriedOut` (nodes that act at once report a plan's or a reply's commands in one input, the
simulator's) folds in as the reports it stands for: along seeded random sequences, two machines
given the same inputs, one told of every command carried out by its reports (the stops'
`Releases`, then each `Started`) and the other by `CarriedOut`, answer alike and end alike."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from gfair.core.scheduler import (
    CarriedOut,
    Migrated,
    QuantumPlan,
    Releases,
    Reply,
    SchedulerConfig,
    ServersChanged,
    SplitStride,
    Start,
    Stop,
    StopReason,
    Suspended,
)
from gfair.core.throughput import ThroughputEstimator

from .test_split_stride_index import NODES, QUANTUM_S, _event

Nodes = Callable[[SplitStride, tuple[Stop, ...], tuple[Start, ...], float], list[Reply]]


def _report(stop: Stop, now: float) -> Suspended | Migrated | None:
    if stop.kill or stop.reason is StopReason.RELEASE:
        return None
    if stop.reason is StopReason.MIGRATION:
        return Migrated(user=stop.user, job_id=stop.job_id, now=now, node_id=stop.node_id, at=now)
    return stop.suspended(now)


def _by_reports(
    m: SplitStride, stops: tuple[Stop, ...], starts: tuple[Start, ...], now: float
) -> list[Reply]:
    """The commands' reports one by one (the stops' together), then what the releases started."""
    reports = tuple(report for stop in stops if (report := _report(stop, now)) is not None)
    released = m.apply(Releases(reports)) if reports else Reply(False)
    for start in starts:
        m.apply(start.started(now))
    return [released, *_carry_out(m, released, now, _by_reports)]


def _at_once(
    m: SplitStride, stops: tuple[Stop, ...], starts: tuple[Start, ...], now: float
) -> list[Reply]:
    released = m.apply(CarriedOut(now, stops, starts))
    return [released, *_carry_out(m, released, now, _at_once)]


def _carry_out(m: SplitStride, output: Reply | QuantumPlan, now: float, how: Nodes) -> list[Reply]:
    if isinstance(output, QuantumPlan):
        stops = tuple(stop for turn in output.turns for stop in turn.stops) + output.strays
        starts = tuple(start for turn in output.turns for start in turn.starts)
    else:
        stops = output.stops
        starts = tuple(start for turn in output.starts.turns for start in turn.starts)
    if not stops and not starts:
        return []
    return how(m, stops, starts, now)


def _state(m: SplitStride, now: float) -> tuple[object, ...]:
    jobs = {
        key: (job.signature(), job.parked, job.coming_up_until, job.prepared_unproven)
        for key, job in m.jobs.items()
    }
    users = {name: (u.entitled, u.credit) for name, u in m.users.items()}
    meter = (m.meter.seconds, m.meter.overrun, m.meter.unheld, m.meter.refundable)
    return jobs, users, meter, sorted(m.held_back), m.snapshot(now).jobs, m.index.free_gpus()


@pytest.mark.parametrize("at_once", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_carried_out_folds_in_as_the_reports_it_stands_for(seed: int, at_once: bool) -> None:
    rng = random.Random(seed)
    machines = [
        SplitStride(
            SchedulerConfig(quantum_s=QUANTUM_S, moves_at_once=at_once), ThroughputEstimator()
        )
        for _ in range(2)
    ]
    for m in machines:
        m.apply(ServersChanged(NODES))
    reported, told = machines
    now = 0.0
    carried = 0
    for serial in range(400):
        now += rng.uniform(0.5, 5.0)
        if serial % 10 == 9:
            outputs = [m.tick(now) for m in machines]
        else:
            event = _event(reported, rng, now, serial)
            if event is None:
                continue
            outputs = [m.apply(event) for m in machines]
        assert outputs[0] == outputs[1], serial
        # Most of the time the nodes carry out what they were told; now and then they are
        # slow, and what they report comes as the random inputs above.
        if rng.random() < 0.8:
            one = _carry_out(reported, outputs[0], now, _by_reports)
            other = _carry_out(told, outputs[1], now, _at_once)
            assert one == other, serial
            carried += len(one)
        assert _state(reported, now) == _state(told, now), serial
    assert carried > 50  # the comparison ran on plenty of carried-out commands
