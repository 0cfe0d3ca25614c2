"""Each `Decision` says which of the kernel's passes chose each job (`Decision.chosen_by`)."""

from __future__ import annotations

from gfair.core.cluster import parse_cluster_spec
from gfair.core.kernel import Pass, PoolState, RunnableJob, Snapshot, UserState, decide


def _pools(spec: str) -> tuple[PoolState, ...]:
    cluster = parse_cluster_spec(spec)
    generations = ["v100", "k80"]
    return tuple(
        PoolState(g, cluster.by_generation(g), rank)
        for rank, g in enumerate(generations)
        if cluster.by_generation(g)
    )


def test_jobs_on_their_users_share_are_chosen_by_stride_the_rest_by_surplus() -> None:
    # The user holds share of the v100s only: two jobs run there on it; the k80s are nobody's
    # share, and its other two jobs run there on what nobody else wanted.
    speeds = {"v100": 1.0, "k80": 1.0}
    jobs = [RunnableJob(f"a{i}", "a", 1, i, speeds) for i in range(4)]
    snapshot = Snapshot(
        _pools("v100:1x2,k80:1x2"),
        {"a": UserState("a", 0, {"v100": 2.0}, {})},
        {"a": jobs},
    )
    decision = decide(snapshot)
    assert decision.chosen_by == {
        "a0": Pass.STRIDE,
        "a1": Pass.STRIDE,
        "a2": Pass.SURPLUS,
        "a3": Pass.SURPLUS,
    }
    assert decision.entitled == {"a0", "a1"}
    assert {decision.placed[j][0][:3] for j in ("a0", "a1")} == {"v10"}


def test_a_job_moved_to_idle_faster_gpus_is_reported_as_fast_first() -> None:
    # Its user's share is the k80s, where it ran; the v100s are idle and it runs 4x as fast
    # there, which repays its move. The whole k80 server it leaves goes to the user's gang, in
    # surplus (a gang of 8 never fits, so someone waits and rule 7 stays out).
    job = RunnableJob("a0", "a", 1, 0, {"v100": 4.0, "k80": 1.0}, running=("k80-0",), move_s=1.0)
    gang = RunnableJob("a1", "a", 4, 1, {"k80": 1.0})
    never = RunnableJob("a2", "a", 8, 2, {"k80": 1.0})
    snapshot = Snapshot(
        _pools("v100:1x1,k80:1x4"),
        {"a": UserState("a", 0, {"k80": 4.0}, {})},
        {"a": [job, gang, never]},
    )
    decision = decide(snapshot)
    assert decision.placed == {"a0": ("v100-0",), "a1": ("k80-0",)}
    assert decision.chosen_by == {"a0": Pass.FAST_FIRST, "a1": Pass.SURPLUS}
    assert decision.waiting == 1


def test_passes_are_described_for_people() -> None:
    assert Pass.describe(Pass.STRIDE, "v100") == "stride, its user's share of v100"
    assert "surplus" in Pass.describe(Pass.SURPLUS, "k80")
    assert "faster pool" in Pass.describe(Pass.FAST_FIRST, "v100")
