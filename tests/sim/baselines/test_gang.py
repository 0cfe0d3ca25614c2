"""Gang-aware stride on one server (docs/design.md §2.2), including the slides' worked example."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.core.tickets import water_fill
from gfair.sim.baselines.gang import GangStride

SIZES = {"A": 1, "B": 1, "C": 2, "D": 2, "E": 4}
# Slides: time -> passes of A..E and the jobs run.
SLIDES = [
    ((0, 0, 0, 0, 0), "E"),
    ((0, 0, 0, 0, 4), "ABC"),
    ((1, 1, 2, 0, 4), "ABD"),
    ((2, 2, 2, 2, 4), "ABC"),
    ((3, 3, 4, 2, 4), "ABD"),
    ((4, 4, 4, 4, 4), "E"),
    ((4, 4, 4, 4, 8), "ABC"),
    ((5, 5, 6, 4, 8), "ABD"),
    ((6, 6, 6, 6, 8), "ABC"),
]


def test_slides_table_is_reproduced_with_first_come_tie_break() -> None:
    # Ties go to the job queued first. The slides run E at the all-equal ties of t0 and t5 and
    # A, B, C (not C, D) at t1 and t3: exactly this rule when E was queued before A, B, C, D.
    server = GangStride(4)
    for name in "EABCD":
        server.join(name, SIZES[name], 1)
    for passes, expected in SLIDES:
        assert server.passes() == dict(zip("ABCDE", passes, strict=True))
        assert "".join(sorted(server.schedule())) == expected


def test_alphabetical_queueing_differs_only_by_the_tie_at_time_zero() -> None:
    server = GangStride(4)
    for name in "ABCDE":
        server.join(name, SIZES[name], 1)
    schedule = ["".join(sorted(server.schedule())) for _ in range(8)]
    # A, B, C take the t0 tie instead of E; E then runs as soon as it holds the minimum pass.
    assert schedule == ["ABC", "ABD", "E", "ABC", "ABD", "ABC", "ABD", "E"]
    gpu_time = {name: 0 for name in SIZES}
    for _ in range(8 * 10):
        for name in server.schedule():
            gpu_time[name] += SIZES[name]
    assert len(set(gpu_time.values())) == 1  # one ticket each: equal GPU-time


def _run(server: GangStride, sizes: dict[str, int], quanta: int) -> dict[str, int]:
    gpu_time = dict.fromkeys(sizes, 0)
    for _ in range(quanta):
        before = server.passes()
        lowest = min(before, key=lambda j: (before[j], server.entry(j).seq))
        run = server.schedule()
        used = sum(sizes[j] for j in run)
        assert used <= server.gpus  # no GPU given twice, gangs whole
        assert len(set(run)) == len(run)
        assert lowest in run  # the lowest-pass job always runs: nobody starves
        free = server.gpus - used
        assert all(sizes[j] > free for j in sizes if j not in run)  # no idle GPU a job fits
        for job in run:
            gpu_time[job] += sizes[job]
    return gpu_time


jobs = st.lists(
    st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 6)), min_size=1, max_size=12
)


@settings(max_examples=80, deadline=None)
@given(gpus=st.sampled_from([1, 2, 4, 8]), spec=jobs, quanta=st.integers(1, 300))
def test_capacity_gangs_no_idle_and_no_starvation(
    gpus: int, spec: list[tuple[int, int]], quanta: int
) -> None:
    server = GangStride(gpus)
    sizes: dict[str, int] = {}
    for index, (size, tickets) in enumerate(spec):
        size = min(size, gpus)
        sizes[f"j{index}"] = size
        server.join(f"j{index}", size, tickets)
    _run(server, sizes, quanta)


@settings(max_examples=60, deadline=None)
@given(
    size=st.sampled_from([1, 2, 4]),
    tickets=st.lists(st.integers(1, 8), min_size=1, max_size=16),
    quanta=st.integers(50, 600),
)
def test_equal_gangs_get_their_water_filled_share(
    size: int, tickets: list[int], quanta: int
) -> None:
    server = GangStride(8)
    sizes = {f"j{i}": size for i in range(len(tickets))}
    for index, count in enumerate(tickets):
        server.join(f"j{index}", size, count)
    gpu_time = _run(server, sizes, quanta)
    share = water_fill(8, {f"j{i}": t for i, t in enumerate(tickets)}, sizes)
    # Each job's GPU-time stays within a bounded distance of its ticket share, however long
    # the horizon: the bound depends on the ticket spread, not on `quanta`.
    bound = size * (max(tickets) / min(tickets) + 1)
    for job, got in gpu_time.items():
        assert abs(got - quanta * share[job]) <= bound


def test_new_tickets_rescale_what_a_job_is_ahead_by() -> None:
    server = GangStride(1)
    server.join("a", 1, 1.0)
    server.join("b", 1, 0.001)  # a sliver of share: each run puts it 1000 ahead
    for _ in range(3):
        server.schedule()
    assert server.passes()["b"] - server.passes()["a"] > 900
    server.set_tickets("b", 1.0)  # the same service, counted at the new rate
    # b was 998 ahead of a (pass 2) at 0.001 tickets: 0.998 ahead at 1 ticket.
    assert server.passes() == {"a": 2.0, "b": pytest.approx(2.998)}
    assert [server.schedule() for _ in range(2)] == [("a",), ("b",)]  # not a thousand quanta
