"""Split stride: local per-server stride plus a central one for multi-server jobs.

See docs/design.md §2.3.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.core.cluster import parse_cluster_spec
from gfair.sim.baselines.paper_split_stride import PerServerStride


def _check_quantum(
    stride: PerServerStride, runs: dict[str, tuple[str, ...]], sizes: dict[str, int]
) -> None:
    for server_id, jobs in runs.items():
        server = stride.cluster.server(server_id)
        multi = [j for j in jobs if len(stride.placement(j)) > 1]
        if multi:
            assert jobs == tuple(multi) and len(multi) == 1  # whole server, nobody else
        else:
            free = server.gpus - sum(sizes[j] for j in jobs)
            assert free >= 0
            waiting = [j for j in stride.local_jobs(server_id) if j not in jobs]
            assert all(sizes[j] > free for j in waiting)  # no idle GPU a waiting job fits
        for job in jobs:
            assert server_id in stride.placement(job)
    for job, servers in stride.placements().items():
        if len(servers) > 1:
            held = [s for s in servers if job in runs.get(s, ())]
            assert held in ([], list(servers))  # all of its servers or none


def test_a_multi_server_job_claims_whole_servers_and_locals_yield() -> None:
    stride = PerServerStride(parse_cluster_spec("v100:3x4"))
    sizes = {"M": 6, "a": 1, "b": 2, "c": 4}
    stride.add("a", ["v100-0"], 1, 1)
    stride.add("b", ["v100-1"], 2, 1)
    stride.add("c", ["v100-2"], 4, 1)
    stride.add("M", ["v100-0", "v100-1"], 6, 1)
    seen_m = seen_local = 0
    for _ in range(40):
        runs = stride.schedule()
        _check_quantum(stride, runs, sizes)
        assert runs["v100-2"] == ("c",)  # uncontested: always local
        if runs.get("v100-0") == ("M",):
            seen_m += 1
            assert runs["v100-1"] == ("M",)
        else:
            seen_local += 1
    assert seen_m and seen_local


@pytest.mark.parametrize("m_tickets", [1.0, 2.0, 4.0])
def test_multi_server_gpu_time_tracks_tickets(m_tickets: float) -> None:
    # Two 4-GPU servers with four 1-GPU jobs of one ticket each, and an 8-GPU job M on both.
    stride = PerServerStride(parse_cluster_spec("k80:2x4"))
    for server in ("k80-0", "k80-1"):
        for index in range(4):
            stride.add(f"{server}/{index}", [server], 1, 1.0)
    stride.add("M", ["k80-0", "k80-1"], 8, m_tickets)
    gpu_time = {"M": 0.0, "k80-0": 0.0, "k80-1": 0.0}
    quanta = 2000
    for _ in range(quanta):
        runs = stride.schedule()
        if runs["k80-0"] == ("M",):
            gpu_time["M"] += 8
        else:
            gpu_time["k80-0"] += len(runs["k80-0"])
            gpu_time["k80-1"] += len(runs["k80-1"])
    # Central stride equalises GPU-time per ticket between M and each server's aggregate.
    per_ticket_m = gpu_time["M"] / m_tickets
    per_ticket_server = gpu_time["k80-0"] / 4.0
    assert per_ticket_m == pytest.approx(per_ticket_server, abs=2 * 8 / min(m_tickets, 4.0))
    assert gpu_time["k80-0"] == gpu_time["k80-1"]


def test_servers_nobody_spans_cost_nothing_centrally() -> None:
    stride = PerServerStride(parse_cluster_spec("k80:3x4"))
    stride.add("x", ["k80-0"], 2, 1)
    stride.add("y", ["k80-1"], 4, 1)
    assert stride.snapshot()["aggregates"] == []
    runs = stride.schedule()
    assert runs == {"k80-0": ("x",), "k80-1": ("y",)}


def test_rejects_bad_placements() -> None:
    stride = PerServerStride(parse_cluster_spec("k80:2x4,v100:1x8"))
    with pytest.raises(ValueError, match="mix GPU generations"):
        stride.add("m", ["k80-0", "v100-0"], 12, 1)
    with pytest.raises(ValueError, match="asks 9 GPUs"):
        stride.add("m", ["k80-0", "k80-1"], 9, 1)
    with pytest.raises(ValueError, match="unknown server"):
        stride.add("m", ["k80-9"], 1, 1)
    with pytest.raises(ValueError, match="the server has 4"):
        stride.add("m", ["k80-0"], 5, 1)
    stride.add("m", ["k80-0"], 1, 1)
    with pytest.raises(ValueError, match="already placed"):
        stride.add("m", ["k80-1"], 1, 1)


def test_move_keeps_the_lag_a_job_had() -> None:
    stride = PerServerStride(parse_cluster_spec("k80:2x1"))
    stride.add("a", ["k80-0"], 1, 1)
    stride.add("b", ["k80-0"], 1, 1)
    stride.add("c", ["k80-1"], 1, 1)
    for _ in range(5):
        stride.schedule()
    lag = stride.pass_of("a") - min(stride.pass_of("a"), stride.pass_of("b"))
    stride.move("a", ["k80-1"], 1)
    assert stride.pass_of("a") == pytest.approx(stride.pass_of("c") + lag)


placements = st.lists(
    st.one_of(
        st.tuples(st.just("local"), st.integers(0, 3), st.sampled_from([1, 2, 4])),
        st.tuples(st.just("multi"), st.integers(0, 2), st.sampled_from([5, 8])),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(spec=placements, tickets=st.lists(st.integers(1, 5), min_size=20, max_size=20))
def test_invariants_and_snapshot_round_trip(
    spec: list[tuple[str, int, int]], tickets: list[int]
) -> None:
    stride = PerServerStride(parse_cluster_spec("a100:4x4"))
    sizes: dict[str, int] = {}
    for index, (kind, first, gpus) in enumerate(spec):
        job = f"j{index}"
        servers = [f"a100-{first}"] if kind == "local" else [f"a100-{first}", f"a100-{first + 1}"]
        stride.add(job, servers, gpus, tickets[index])
        sizes[job] = gpus
    for _ in range(30):
        runs = stride.schedule()
        _check_quantum(stride, runs, sizes)
        for server in stride.cluster.servers:
            if server.id not in runs:
                # An idle server has no local job: it runs locally unless a gang took it.
                assert not stride.local_jobs(server.id)
    snapshot = json.loads(json.dumps(stride.snapshot()))
    copy = PerServerStride(stride.cluster)
    copy.restore(snapshot)
    assert [stride.schedule() for _ in range(20)] == [copy.schedule() for _ in range(20)]


def _twin_strides() -> tuple[PerServerStride, PerServerStride]:
    strides = (
        PerServerStride(parse_cluster_spec("v100:3x4")),
        PerServerStride(parse_cluster_spec("v100:3x4")),
    )
    for stride in strides:
        stride.add("a", ["v100-0"], 1, 1.0)
        stride.add("b", ["v100-0"], 2, 2.0)
        stride.add("c", ["v100-0"], 2, 1.0)
        stride.add("M", ["v100-1", "v100-2"], 6, 1.0)
        stride.add("N", ["v100-1", "v100-2"], 8, 3.0)
        for _ in range(5):
            stride.schedule()
    return strides


def test_setting_many_tickets_at_once_is_setting_them_one_by_one() -> None:
    batch, single = _twin_strides()
    changes = {"a": 4.0, "b": 0.5, "M": 2.0, "N": 0.25}
    batch.set_many(changes)
    for job_id, tickets in changes.items():
        single.set_tickets(job_id, tickets)
    assert batch.snapshot() == single.snapshot()
    assert batch.loads() == single.loads()
    for _ in range(20):
        assert batch.schedule() == single.schedule()


def test_bad_tickets_in_a_batch_change_nothing() -> None:
    stride, untouched = _twin_strides()
    with pytest.raises(ValueError):
        stride.set_many({"a": 2.0, "M": 0.0})
    assert stride.snapshot() == untouched.snapshot()


def test_a_quantum_skips_servers_left_empty_and_restored_ones_run() -> None:
    stride = PerServerStride(parse_cluster_spec("v100:3x4"))
    stride.add("a", ["v100-0"], 1, 1.0)
    stride.add("b", ["v100-2"], 1, 1.0)
    assert stride.schedule() == {"v100-0": ("a",), "v100-2": ("b",)}
    stride.remove("a")
    assert stride.schedule() == {"v100-2": ("b",)}
    twin = PerServerStride(parse_cluster_spec("v100:3x4"))
    twin.restore(stride.snapshot())
    assert twin.schedule() == {"v100-2": ("b",)}
