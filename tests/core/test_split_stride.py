"""The split-stride state machine driven directly: events in, plans out (docs/design.md §2.3,
§2.7). The service's own tests (tests/services/test_split_stride*.py) drive it through the bus."""

from __future__ import annotations

import copy

import pytest

from gfair.core.scheduler import (
    Admitted,
    Ended,
    Exited,
    Migrated,
    Node,
    NodeHealth,
    Parked,
    Phase,
    Recording,
    Releases,
    Reply,
    SchedulerConfig,
    ServersChanged,
    ServerTurn,
    SplitStride,
    Start,
    Stop,
    StopReason,
    TypeProfiled,
    replay,
)
from gfair.core.switch_costs import SwitchCosts
from gfair.core.throughput import ThroughputEstimator

QUANTUM_S = 60.0


def machine(*nodes: tuple[str, int], journal: Recording | None = None) -> SplitStride:
    made = SplitStride(SchedulerConfig(quantum_s=QUANTUM_S), ThroughputEstimator(), journal=journal)
    made.apply(
        ServersChanged(
            tuple(Node(name, name.split("-")[0], tuple(range(gpus))) for name, gpus in nodes)
        )
    )
    return made


def admit(
    m: SplitStride, user: str, job_id: str, now: float, gpus: int = 1, *, prepare: bool = False
) -> Reply:
    return m.apply(
        Admitted(
            user=user,
            job_id=job_id,
            now=now,
            gpus=gpus,
            weight=1.0,
            job_type=None,
            prepare=prepare,
        )
    )


def started(m: SplitStride, start: Start, at: float) -> None:
    reply = m.apply(start.started(at))
    assert reply.changed


def suspended(
    m: SplitStride, stop: Stop, at: float, *, in_place: bool = False, starting: bool = False
) -> Reply:
    return m.apply(stop.suspended(at, in_place=in_place, starting=starting))


def only_start(turns: tuple[ServerTurn, ...]) -> Start:
    (start,) = [start for turn in turns for start in turn.starts]
    return start


def test_an_admitted_job_starts_at_once_on_idle_gpus_and_its_reports_are_folded_in() -> None:
    m = machine(("v100-0", 2))
    reply = admit(m, "alice", "a", 10.0)
    start = only_start(reply.starts.turns)
    assert (start.node_id, start.gpu_indices, start.servers) == ("v100-0", (0,), ("v100-0",))
    assert reply.starts.placed[0].generation == "v100"
    stay = m.jobs["alice.a"].stays["v100-0"]
    assert stay.phase is Phase.STARTING
    started(m, start, 12.0)
    assert m.jobs["alice.a"].stays["v100-0"].phase == Phase.RUNNING
    # The same admission again changes nothing.
    assert not admit(m, "alice", "a", 13.0).changed


def test_two_jobs_on_one_gpu_take_turns_a_suspend_first_then_the_start() -> None:
    m = machine(("v100-0", 1))
    first = only_start(admit(m, "alice", "a", 0.0).starts.turns)
    started(m, first, 0.0)
    assert not admit(m, "bob", "b", 1.0).starts.turns  # no GPU free
    holders = []
    for quantum in range(4):
        plan = m.tick(QUANTUM_S * (quantum + 1))
        (turn,) = plan.turns
        holders.append(turn.running)
        for stop in turn.stops:
            assert stop.reason is StopReason.TIME_SLICE
            suspended(m, stop, QUANTUM_S * (quantum + 1) + 1)
        for start in turn.starts:
            assert turn.stops  # the GPU is freed on the node before it is given again
            started(m, start, QUANTUM_S * (quantum + 1) + 2)
    assert holders[0] != holders[1] != holders[2] != holders[3]


def test_a_suspend_confirmed_late_is_charged_to_who_held_the_gpu() -> None:
    m = machine(("v100-0", 1))
    first = only_start(admit(m, "alice", "a", 0.0).starts.turns)
    started(m, first, 0.0)
    admit(m, "bob", "b", 0.0)
    stop = None
    now = 0.0
    while stop is None:
        now += QUANTUM_S
        (turn,) = m.tick(now).turns
        stop = next(iter(turn.stops), None)
    suspended(m, stop, now + 5.0)
    assert m.meter.overrun["alice"]["v100"] == pytest.approx(5.0)


def test_a_stop_of_a_start_never_confirmed_is_forgotten_soon() -> None:
    m = machine(("v100-0", 1))
    admit(m, "alice", "a", 0.0)  # its node never answers
    admit(m, "bob", "b", 0.0)
    now = 0.0
    while not m.jobs["alice.a"].stays["v100-0"].unconfirmed:
        now += 1.0
        m.tick(now)
    plan = m.tick(now + m.config.unconfirmed_release_s + 1)
    assert [(f.job, f.start_confirmed) for f in plan.forgotten] == [("alice.a", False)]


def test_a_node_letting_go_of_an_earlier_process_leaves_a_start_it_has_yet_to_carry_out() -> None:
    # alice's job is parked in place and told to resume there; before the node reads that
    # start, its executor restarts and stops the parked process: a drain no stop asked for.
    m = machine(("v100-0", 1))
    started(m, only_start(admit(m, "alice", "a", 0.0).starts.turns), 0.0)
    admit(m, "bob", "b", 0.0)
    now = 0.0
    resume: Start | None = None
    while resume is None and now < 10 * QUANTUM_S:
        now += QUANTUM_S
        turns = m.tick(now).turns
        for turn in turns:
            for stop in turn.stops:
                suspended(m, stop, now, in_place=True)
        starts = [s for turn in turns for s in turn.starts]
        resume = next((s for s in starts if s.job_id == "a" and m.jobs["alice.a"].parked), None)
        for start in starts:
            if start is not resume:
                started(m, start, now)
    assert resume is not None and m.jobs["alice.a"].parked == ("v100-0", resume.gpu_indices)
    drain = Stop("alice", "a", resume.node_id, 1, StopReason.DRAIN).suspended(now + 1)
    assert m.apply(drain).changed
    job = m.jobs["alice.a"]
    assert job.parked is None  # that process is gone: the start brings it back from a checkpoint
    assert list(job.stays) == [resume.node_id]
    assert job.stays[resume.node_id].phase is Phase.STARTING  # and it still stands
    started(m, resume, now + 2)
    assert job.stays[resume.node_id].phase is Phase.RUNNING


def test_a_command_is_not_forgotten_while_its_nodes_reports_wait_unread() -> None:
    # The driver has read its nodes' reports only up to `heard_until` (a backlog): a start's
    # confirmation may wait in it, and forgetting the start would put the job on two servers.
    m = machine(("v100-0", 1))
    admit(m, "alice", "a", 0.0)
    admit(m, "bob", "b", 0.0)
    now = 0.0
    while not m.jobs["alice.a"].stays["v100-0"].unconfirmed:
        now += 1.0
        m.tick(now)
    late = now + 10 * m.config.unconfirmed_release_s
    behind = copy.deepcopy(m)
    assert behind.tick(late, heard_until=now).forgotten == ()
    # Read up to then, with no answer among the reports: it is forgotten.
    plan = m.tick(late, heard_until=late)
    assert ("alice.a", False) in [(f.job, f.start_confirmed) for f in plan.forgotten]


def test_the_exit_of_a_copy_left_on_a_failed_node_is_ignored() -> None:
    m = machine(("v100-0", 1), ("v100-1", 1))
    first = only_start(admit(m, "alice", "a", 0.0).starts.turns)
    started(m, first, 0.0)
    other = "v100-1" if first.node_id == "v100-0" else "v100-0"
    nodes = tuple(
        Node(n.node_id, n.generation, n.gpu_indices, NodeHealth.FAILED)
        if n.node_id == first.node_id
        else n
        for n in m.nodes.values()
    )
    assert m.apply(ServersChanged(nodes)).changed
    assert not m.jobs["alice.a"].stays  # its processes died with the node
    (turn,) = [t for t in m.tick(QUANTUM_S).turns if t.starts]
    started(m, turn.starts[0], QUANTUM_S + 1)
    assert turn.node_id == other
    reply = m.apply(
        Exited(user="alice", job_id="a", now=70.0, node_id=first.node_id, attempt=1, at=70.0)
    )
    assert not reply.changed and reply.ignored is not None
    assert not m.jobs["alice.a"].exited


def carry_out(m: SplitStride, turns: tuple[ServerTurn, ...], now: float) -> None:
    """The nodes: every stop done in place, then every start."""
    for turn in turns:
        for stop in turn.stops:
            suspended(m, stop, now, in_place=True)
        for start in turn.starts:
            started(m, start, now)


def test_a_job_suspended_in_place_resumes_on_its_own_gpus() -> None:
    m = machine(("v100-0", 2))
    b = only_start(admit(m, "bob", "b", 0.0).starts.turns)
    a = only_start(admit(m, "alice", "a", 0.0).starts.turns)
    assert a.gpu_indices == (1,)  # not the lowest: where it resumes is no accident
    started(m, a, 0.0)
    started(m, b, 0.0)
    admit(m, "cat", "c", 0.0, gpus=2)
    now = 0.0
    while m.jobs["alice.a"].parked is None:  # until cat's gang takes both GPUs
        now += QUANTUM_S
        carry_out(m, m.tick(now).turns, now)
    assert m.jobs["alice.a"].parked == ("v100-0", a.gpu_indices)
    resumed: list[Start] = []
    while not resumed:
        now += QUANTUM_S
        turns = m.tick(now).turns
        resumed = [s for turn in turns for s in turn.starts if s.job_id == "a"]
        carry_out(m, turns, now)
    assert resumed[0].gpu_indices == a.gpu_indices


def test_an_ended_job_is_killed_where_it_holds_gpus_and_its_gpus_go_to_a_waiting_job() -> None:
    m = machine(("v100-0", 1))
    first = only_start(admit(m, "alice", "a", 0.0).starts.turns)
    started(m, first, 0.0)
    admit(m, "bob", "b", 0.0)
    reply = m.apply(Ended(user="alice", job_id="a", now=5.0, state="cancelled"))
    assert [(s.job_id, s.reason) for s in reply.stops] == [("a", "the job is cancelled")]
    assert only_start(reply.starts.turns).job_id == "b"
    assert "alice" not in m.users  # left with its last job


def test_a_prepared_start_goes_where_it_could_run_and_an_unwanted_park_is_let_go() -> None:
    m = machine(("v100-0", 1), ("k80-0", 1))
    only_start(admit(m, "alice", "a", 0.0).starts.turns)
    only_start(admit(m, "alice", "b", 0.0).starts.turns)
    reply = admit(m, "bob", "w", 0.0, prepare=True)
    ((placement, prepare),) = reply.prepares
    assert (prepare.node_id, prepare.generation) == ("v100-0", "v100")  # the fastest pool
    assert placement.servers == ("v100-0",)
    assert m.apply(Parked(user="bob", job_id="w", now=1.0, node_id="v100-0", attempt=1)).changed
    assert m.jobs["bob.w"].parked == ("v100-0", ())
    # A park reported after the job ended: the process there is let go.
    m.apply(Ended(user="bob", job_id="w", now=2.0, state="cancelled"))
    reply = m.apply(Parked(user="bob", job_id="w", now=3.0, node_id="v100-0", attempt=1))
    assert [(s.node_id, s.reason) for s in reply.stops] == [("v100-0", StopReason.RELEASE)]


def test_releases_handed_in_together_give_their_gpus_to_waiting_jobs_once() -> None:
    m = machine(("v100-0", 2))
    for job_id in ("a", "b"):
        started(m, only_start(admit(m, "alice", job_id, 0.0).starts.turns), 0.0)
    for job_id in ("c", "d"):
        assert not admit(m, "bob", job_id, 1.0).starts.turns  # both GPUs held
    ended = tuple(
        Exited(user="alice", job_id=job_id, now=5.0, node_id="v100-0", attempt=1, at=4.0)
        for job_id in ("a", "b")
    )
    reply = m.apply(Releases(ended))
    # One fill after both: both GPUs go to bob's jobs in the one reply.
    starts = [(s.job_id, s.gpu_indices) for turn in reply.starts.turns for s in turn.starts]
    assert sorted(starts) == [("c", (0,)), ("d", (1,))]
    assert all(m.jobs[f"alice.{job_id}"].exited for job_id in ("a", "b"))
    # Reports the machine has no use for (jobs it does not know) change nothing.
    again = Exited(user="eve", job_id="x", now=6.0, node_id="v100-0", attempt=1, at=6.0)
    assert m.apply(Releases((again, again))) == Reply(False)


def killed_coming_up(m: SplitStride, stop: Stop, at: float) -> Reply:
    """The node forced the job off before its first mini-batch (its import outlasted the
    slice)."""
    return suspended(m, stop, at, starting=True)


def slice_ends_for(m: SplitStride, job_id: str, now: float) -> Stop:
    """Ticks until `job_id` is told to stop; the others' stops and starts are carried out."""
    while True:
        now += QUANTUM_S
        turns = m.tick(now).turns
        stops = [stop for turn in turns for stop in turn.stops if stop.job_id == job_id]
        if stops:
            return stops[0]
        carry_out(m, turns, now)


def slow_starter(*, opted_in: bool = True) -> tuple[SplitStride, Stop]:
    """Three jobs on two GPUs, taking turns; alice's slice ends while it still comes up."""
    m = machine(("v100-0", 1), ("v100-1", 1))
    only_start(admit(m, "bob", "b", 0.0).starts.turns)
    first = only_start(admit(m, "alice", "slow", 0.0, prepare=opted_in).starts.turns)
    admit(m, "cat", "c", 0.0)
    started(m, first, 0.0)
    return m, slice_ends_for(m, "slow", 0.0)


def slice_starts_for(m: SplitStride, job_id: str, now: float) -> Start:
    """Ticks until `job_id` is started (within a few quanta); the others' switches are carried
    out."""
    for _ in range(5):
        now += QUANTUM_S
        turns = m.tick(now).turns
        if found := starts_of(turns, job_id):
            return found[0]
        carry_out(m, turns, now)
    raise AssertionError(f"{job_id} was not started within 5 quanta")


def starts_of(turns: tuple[ServerTurn, ...], job_id: str) -> list[Start]:
    return [start for turn in turns for start in turn.starts if start.job_id == job_id]


def test_a_job_whose_slice_ends_while_it_comes_up_comes_up_without_gpus_before_its_next() -> None:
    m, stop = slow_starter()
    reply = killed_coming_up(m, stop, QUANTUM_S)
    # Started anew at its next slice it would be killed at its end again, and never train: its
    # process starts without GPUs where it ran, and is given none until it is up there.
    ((_, prepare),) = reply.prepares
    assert prepare.node_id == stop.node_id
    now = QUANTUM_S
    for _ in range(2):  # its turn, twice over, but it is not up yet
        now += QUANTUM_S / 2
        turns = m.tick(now).turns
        assert not starts_of(turns, "slow")
        carry_out(m, turns, now)
    m.apply(Parked(user="alice", job_id="slow", now=now, node_id=prepare.node_id, attempt=1))
    resumed = slice_starts_for(m, "slow", now)
    assert resumed.node_id == prepare.node_id  # its process waits there: resumed in place


def test_a_prepared_process_that_never_comes_up_is_not_prepared_again_until_one_does() -> None:
    m, stop = slow_starter()
    assert killed_coming_up(m, stop, QUANTUM_S).prepares != ()
    # It never parks: past `prepared_wait_s` it runs anyway, and is not prepared again when
    # killed coming up (it would hold up every slice's start on its node for as long as a
    # resume may take) ...
    again = slice_ends_for(m, "slow", QUANTUM_S + m.config.prepared_wait_s)
    assert killed_coming_up(m, again, 5 * QUANTUM_S).prepares == ()
    # ... until one of its processes came up.
    m.apply(Parked(user="alice", job_id="slow", now=0.0, node_id=again.node_id, attempt=1))
    later = slice_ends_for(m, "slow", 10 * QUANTUM_S)
    assert killed_coming_up(m, later, 11 * QUANTUM_S).prepares != ()


def test_a_job_not_opted_in_to_prepared_starts_is_never_started_without_gpus() -> None:
    # Its process may touch a GPU before Job.from_env(), where it would see none.
    m, stop = slow_starter(opted_in=False)
    assert killed_coming_up(m, stop, QUANTUM_S).prepares == ()


def test_a_prepared_start_is_given_no_gpus_until_its_process_is_up() -> None:
    m = machine(("v100-0", 1))
    started(m, only_start(admit(m, "alice", "a", 0.0).starts.turns), 0.0)
    ((_, prepare),) = admit(m, "bob", "w", 0.0, prepare=True).prepares
    # Its turn comes (the second quantum), but its process still imports: the GPU stays
    # alice's meanwhile.
    for quantum in (1, 2):
        turns = m.tick(quantum * QUANTUM_S).turns
        assert not starts_of(turns, "w")
        carry_out(m, turns, quantum * QUANTUM_S)
    now = 2 * QUANTUM_S + 1
    m.apply(Parked(user="bob", job_id="w", now=now, node_id=prepare.node_id, attempt=1))
    # Up and parked: its slice resumes it there.
    assert slice_starts_for(m, "w", now).node_id == prepare.node_id


def test_a_journal_replayed_into_a_machine_restored_alike_gives_the_same_outputs() -> None:
    recording = Recording()
    m = machine(("v100-0", 2), ("k80-0", 2), journal=recording)
    for n, user in enumerate(("alice", "bob", "cat", "alice", "bob")):
        for turn in admit(m, user, f"j{n}", float(n), gpus=1 + n % 2).starts.turns:
            for start in turn.starts:
                started(m, start, float(n))
    for quantum in range(1, 6):
        now = QUANTUM_S * quantum
        for turn in m.tick(now).turns:
            for stop in turn.stops:
                suspended(m, stop, now + 1)
            for start in turn.starts:
                started(m, start, now + 2)
    assert len(recording.entries) > 10
    assert (
        replay(machine(("v100-0", 2), ("k80-0", 2)), recording.inputs[1:])
        == (recording.outputs[1:])
    )


def test_a_saved_machine_restored_decides_the_next_quantum_alike() -> None:
    m = machine(("v100-0", 1))
    started(m, only_start(admit(m, "alice", "a", 0.0).starts.turns), 0.0)
    admit(m, "bob", "b", 0.0)
    m.tick(QUANTUM_S)
    # What a driver persists is a copy (the machine's own records are shared by `saved`).
    restored = SplitStride(m.config, ThroughputEstimator(), copy.deepcopy(m.saved()))
    assert restored.tick(2 * QUANTUM_S) == m.tick(2 * QUANTUM_S)


def test_a_job_admitted_with_its_own_costs_is_weighed_with_them_until_measured() -> None:
    m = machine(("v100-0", 1))
    admit(m, "ann", "a", 0.0)
    own = SwitchCosts(resume_s=2.0, migration_s=90.0)
    m.apply(Admitted(user="ann", job_id="b", now=0.0, gpus=1, weight=1.0, job_type=None, costs=own))
    states = {state.id: state for state in m.snapshot(0.0).jobs["ann"]}
    operator = m.config.operator_costs
    assert (states["ann.a"].move_s, states["ann.a"].resume_s) == (
        operator.migration_s,
        operator.resume_s,
    )
    assert (states["ann.b"].move_s, states["ann.b"].resume_s) == (90.0, 2.0)


def test_users_new_between_ticks_join_their_pools_together_at_the_next_tick() -> None:
    # ann's job holds a GPU through the first tick; bob and cat arrive before the next one and
    # are started on the idle GPUs at once, on the shares of the last tick (they have none yet).
    m = machine(("v100-0", 3))
    started(m, only_start(admit(m, "ann", "a", 0.0).starts.turns), 0.0)
    m.tick(0.0)
    for user in ("bob", "cat"):
        started(m, only_start(admit(m, user, "x", 10.0).starts.turns), 10.0)
        assert m.users[user].credit == {}
    m.tick(QUANTUM_S)
    # Joined at the same tick on the same shares: at the same credit.
    assert m.users["bob"].credit == m.users["cat"].credit != {}


@pytest.mark.parametrize("at_once", [False, True])
def test_a_moved_job_starts_once_its_old_node_let_go_or_in_the_plan_when_nodes_let_go_at_once(
    at_once: bool,
) -> None:
    config = SchedulerConfig(quantum_s=QUANTUM_S, moves_at_once=at_once)
    m = SplitStride(config, ThroughputEstimator())
    m.apply(ServersChanged((Node("v100-0", "v100", (0,)), Node("k80-0", "k80", (0,)))))
    for user, job_id in (("alice", "a"), ("bob", "b")):
        started(m, only_start(admit(m, user, job_id, 0.0).starts.turns), 0.0)
    assert set(m.jobs["bob.b"].stays) == {"k80-0"}
    m.apply(Ended(user="alice", job_id="a", now=1.0, state="completed"))
    # The V100 is idle and b runs faster there: the kernel moves it.
    plan = m.tick(QUANTUM_S)
    (stop,) = [stop for turn in plan.turns for stop in turn.stops]
    assert (stop.job_id, stop.node_id, stop.reason) == ("b", "k80-0", StopReason.MIGRATION)
    in_plan = starts_of(plan.turns, "b")
    # Never held on two servers at once: the old stay holds no GPU from its stop on.
    holding = {node for node, stay in m.jobs["bob.b"].stays.items() if stay.holds_gpus}
    report = Migrated(user="bob", job_id="b", now=QUANTUM_S, node_id="k80-0", at=QUANTUM_S)
    reply = m.apply(report)
    after = starts_of(reply.starts.turns, "b")
    if at_once:
        assert [s.node_id for s in in_plan] == ["v100-0"] and holding == {"v100-0"}
        assert not after  # the report only lets the old stay go
    else:
        assert not in_plan and not holding  # it waits for k80-0 to let go
        assert [s.node_id for s in after] == ["v100-0"]
    assert set(m.jobs["bob.b"].stays) == {"v100-0"}


def test_a_profile_works_out_again_only_the_speeds_of_its_users_jobs_of_its_type() -> None:
    m = machine(("v100-0", 1), ("k80-0", 1))
    for user, job_id, job_type in (("ann", "a", "big"), ("ann", "b", None), ("bob", "c", "big")):
        m.apply(Admitted(user=user, job_id=job_id, now=0.0, gpus=1, weight=1.0, job_type=job_type))

    def speeds() -> dict[str, dict[str, float]]:
        jobs = m.snapshot(0.0).jobs
        return {state.id: state.speeds for queue in jobs.values() for state in queue}

    before = speeds()
    assert before["ann.a"] == before["bob.c"]  # the same type, nobody profiled
    m.apply(TypeProfiled("ann", "big", {"v100": 1.0, "k80": 0.9}))
    after = speeds()
    assert after["ann.a"]["k80"] / after["ann.a"]["v100"] == pytest.approx(0.9)
    assert after["ann.a"] is not before["ann.a"]
    # ann's job of another type and bob's of this one keep theirs, not worked out again.
    assert after["ann.b"] is before["ann.b"] and after["bob.c"] is before["bob.c"]
    assert after["bob.c"] != after["ann.a"]


def test_a_start_stands_until_the_machine_may_forget_it() -> None:
    # A node refuses a start read later (`Start.valid_until`): by then the machine may have
    # forgotten it (unconfirmed for `release_timeout_s`, or stopped unconfirmed at the next
    # tick and forgotten `unconfirmed_release_s` after), and run the job elsewhere.
    m = machine(("v100-0", 1), ("v100-1", 1))
    config = m.config
    early = only_start(admit(m, "alice", "a", 5.0).starts.turns)  # before any tick
    assert early.valid_until == 5.0 + config.unconfirmed_release_s
    started(m, early, 5.0)
    m.tick(QUANTUM_S)
    between = only_start(admit(m, "bob", "b", QUANTUM_S + 50.0).starts.turns)
    assert between.valid_until == 2 * QUANTUM_S + config.unconfirmed_release_s
    assert config.quantum_s + config.unconfirmed_release_s < config.release_timeout_s
