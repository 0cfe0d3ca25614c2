"""Load balancing within a generation: threshold, budget, no thrash (docs/design.md §2.3)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.core.balance import (
    Move,
    Resident,
    least_loaded,
    least_loaded_group,
    propose_migrations,
    spread,
)
from gfair.core.cluster import Server

SERVERS = tuple(Server(f"s{i}", "v100", 8) for i in range(4))


def _residents(counts: list[int], tickets: float = 1.0) -> dict[str, list[Resident]]:
    return {
        f"s{i}": [Resident(f"s{i}/{n}", 1, tickets) for n in range(count)]
        for i, count in enumerate(counts)
    }


def _propose(
    servers: tuple[Server, ...],
    residents: dict[str, list[Resident]],
    threshold: float,
    budget: int,
) -> list[Move]:
    tickets = {s: sum(r.tickets for r in rs) for s, rs in residents.items()}
    return propose_migrations(servers, tickets, lambda s: residents.get(s, ()), threshold, budget)


def _potential(servers: tuple[Server, ...], residents: dict[str, list[Resident]]) -> float:
    return sum(sum(r.tickets for r in residents[s.id]) ** 2 / s.gpus for s in servers)


def _apply(residents: dict[str, list[Resident]], moves: list[Move]) -> None:
    for move in moves:
        resident = next(r for r in residents[move.from_server] if r.job_id == move.job_id)
        residents[move.from_server].remove(resident)
        residents[move.to_server].append(resident)


def test_new_jobs_go_to_the_least_loaded_feasible_server() -> None:
    servers = (Server("small", "v100", 2), *SERVERS)
    load = {"small": 0.0, "s0": 8.0, "s1": 4.0, "s2": 4.0, "s3": 6.0}
    assert least_loaded(servers, load, 1, 1.0) == servers[0]
    assert least_loaded(servers, load, 4, 1.0) == SERVERS[1]  # first of the tie
    assert least_loaded(servers, load, 9, 1.0) is None
    assert [s.id for s in least_loaded_group(SERVERS, load, 16)] == ["s1", "s2"]
    assert least_loaded_group(SERVERS, load, 33) == ()


def test_nothing_moves_within_the_threshold() -> None:
    residents = _residents([17, 15, 16, 16])  # spread 2/16 = 0.125
    assert spread(SERVERS, {s: float(len(r)) for s, r in residents.items()}) == 0.125
    assert _propose(SERVERS, residents, threshold=0.25, budget=10) == []
    assert len(_propose(SERVERS, residents, threshold=0.1, budget=10)) == 1


def test_moves_go_from_most_to_least_loaded_within_the_budget() -> None:
    residents = _residents([24, 8, 16, 16])
    moves = _propose(SERVERS, residents, threshold=0.0, budget=3)
    assert len(moves) == 3
    assert all(m.from_server == "s0" and m.to_server == "s1" for m in moves)
    unlimited = _propose(SERVERS, _residents([24, 8, 16, 16]), 0.0, budget=100)
    assert len(unlimited) == 8  # exactly evens out, then stops


def test_unmovable_and_too_big_jobs_stay() -> None:
    residents = {
        "s0": [Resident("gang", 8, 10.0, movable=False), Resident("big", 8, 1.0)],
        "s1": [],
    }
    servers = (SERVERS[0], Server("s1", "v100", 4))
    assert _propose(servers, residents, threshold=0.0, budget=5) == []


loads = st.lists(
    st.lists(st.tuples(st.integers(1, 8), st.floats(0.1, 5)), max_size=12), min_size=2, max_size=6
)


@settings(max_examples=150, deadline=None)
@given(layout=loads, threshold=st.floats(0, 1), budget=st.integers(0, 6))
def test_every_move_strictly_lowers_the_potential_and_nothing_thrashes(
    layout: list[list[tuple[int, float]]], threshold: float, budget: int
) -> None:
    servers = tuple(Server(f"s{i}", "v100", 8) for i in range(len(layout)))
    residents = {
        f"s{i}": [Resident(f"s{i}/{n}", g, t) for n, (g, t) in enumerate(jobs)]
        for i, jobs in enumerate(layout)
    }
    states = {_state(residents)}
    for _ in range(10):  # repeated rounds with tickets unchanged
        before = _potential(servers, residents)
        moves = _propose(servers, residents, threshold, budget)
        assert len(moves) <= budget
        for move in moves:
            _apply(residents, [move])
            after = _potential(servers, residents)
            assert after < before
            before = after
            state = _state(residents)
            assert state not in states  # no layout comes back: no thrash
            states.add(state)
        if not moves:
            break


def _state(residents: dict[str, list[Resident]]) -> frozenset[tuple[str, str]]:
    return frozenset((s, r.job_id) for s, rs in residents.items() for r in rs)


def test_relief_moves_a_waiting_job_to_free_gpus_whatever_the_tickets() -> None:
    servers = (Server("a", "v100", 4), Server("b", "v100", 4))
    residents = {
        "a": [Resident("big", 4, 1.0), Resident("small", 2, 1.0)],  # asks 6 of 4: time-slices
        "b": [Resident("heavy", 2, 10.0)],  # heavy in tickets but 2 GPUs free
    }
    tickets = {s: sum(r.tickets for r in rs) for s, rs in residents.items()}
    asked = {s: sum(r.gpus for r in rs) for s, rs in residents.items()}
    moves = propose_migrations(servers, tickets, residents.__getitem__, 10.0, 5, asked)
    assert moves == [Move("small", "a", "b")]
    # Without GPU counts only tickets matter, and "b" looks far busier: nothing moves to it.
    assert propose_migrations(servers, tickets, residents.__getitem__, 0.0, 5) == []


@settings(max_examples=150, deadline=None)
@given(layout=loads, threshold=st.floats(0, 1), budget=st.integers(0, 6))
def test_with_gpu_counts_every_move_lowers_excess_then_potential(
    layout: list[list[tuple[int, float]]], threshold: float, budget: int
) -> None:
    servers = tuple(Server(f"s{i}", "v100", 8) for i in range(len(layout)))
    residents = {
        f"s{i}": [Resident(f"s{i}/{n}", g, t) for n, (g, t) in enumerate(jobs)]
        for i, jobs in enumerate(layout)
    }

    def measure() -> tuple[int, float]:
        excess = sum(max(0, sum(r.gpus for r in residents[s.id]) - s.gpus) for s in servers)
        return excess, _potential(servers, residents)

    states = {_state(residents)}
    for _ in range(10):
        tickets = {s: sum(r.tickets for r in rs) for s, rs in residents.items()}
        asked = {s: sum(r.gpus for r in rs) for s, rs in residents.items()}
        moves = propose_migrations(
            servers, tickets, lambda s: residents[s], threshold, budget, asked
        )
        assert len(moves) <= budget
        for move in moves:
            before = measure()
            _apply(residents, [move])
            after = measure()
            assert after[0] < before[0] or (after[0] == before[0] and after[1] < before[1])
            state = _state(residents)
            assert state not in states
            states.add(state)
        if not moves:
            break
