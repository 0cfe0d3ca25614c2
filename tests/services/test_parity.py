"""One state machine, two drivers: a scripted workload driven through the simulator's
`gandiva-fair` policy and through the split-stride service (on the in-memory bus, with a fake
clock) leaves the two `SplitStride` machines alike, quantum by quantum (docs/design.md §2.7):
the same jobs on the same GPU indices, started between ticks alike, and the same accounts
(entitlement and credit per pool) and job passes. The simulator and the service feed the
machine alike.

The test plays placement (it writes each job's record and announces its admission) and the node
executors (it confirms every start and suspend at once), so what differs between the two runs is
only how the drivers feed the machine: the simulator plays placement, the auction and the nodes
in-process (its nodes let go at once, `SchedulerConfig.moves_at_once`); the service hears them on
the bus, keeps its records and reports moves as its nodes confirm them.
The workload has three users with unequal tickets, 1- to 8-GPU gangs (an 8-GPU gang spans two
servers), job types that run at different speeds on V100 and K80, arrivals while the cluster is
backlogged and jobs that end; it runs once with flat tickets and once with a shares file
(accounts above the users: `SchedulerConfig.shares`, the services' `GFAIR_SHARES_FILE`).
Both run in the same virtual time (the simulator's clock is the service's fake clock).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.runtime import ServiceRuntime
from gfair.core.cluster import Cluster, Server
from gfair.core.scheduler import Journal, Phase, SchedulerConfig, SplitStride
from gfair.core.shares_file import parse_shares
from gfair.core.shares_tree import ShareTree
from gfair.events.commands import NodeCommand, StartCommand, SuspendCommand
from gfair.events.envelope import Envelope
from gfair.events.jobs import JobCompleted, JobStarted, JobSuspended
from gfair.events.scheduling import ScheduleDecided
from gfair.gavel import load_throughputs
from gfair.sim.gandiva_fair_machine import GandivaFairMachine
from gfair.sim.trace import TraceJob
from gfair.state.buckets import JOBS
from gfair.state.job_record import JobRecord, save_job
from gfair_services.split_stride import SplitStrideService, SplitStrideSettings
from support.clock import FakeClock
from support.waiting import eventually

from .scheduling_harness import FAST, Probe, registered, submitted

SERVERS = (
    Server("k80-0", "k80", 4),
    Server("k80-1", "k80", 4),
    Server("v100-0", "v100", 4),
    Server("v100-1", "v100", 4),
)
TICKETS = {"ann": 1.0, "ben": 1.0, "cat": 2.0}
# ann and ben in one account of 1 ticket, 1:2 within it; cat, not in the file, at the root with
# its flat 2: 1/9, 2/9 and 2/3, where the same users' tickets without the account (1, 2, 2)
# would give 20%, 40% and 40%.
SHARES = """\
[accounts.lab]
tickets = 1
[users.ann]
account = "lab"
[users.ben]
account = "lab"
tickets = 2
"""
RESNET = "ResNet-50 (batch size 64)"
TRANSFORMER = "Transformer (batch size 64)"
A3C = "A3C"
QUANTA = 24
QUANTUM_S = 3600.0
START = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Arrival:
    quantum: int
    user: str
    job_id: str
    gpus: int
    job_type: str


ARRIVALS = (
    Arrival(0, "ann", "a1", 1, RESNET),
    Arrival(0, "ann", "a2", 2, RESNET),
    Arrival(0, "ann", "a3", 4, TRANSFORMER),
    Arrival(0, "ben", "b1", 8, TRANSFORMER),
    Arrival(0, "ben", "b2", 1, A3C),
    Arrival(0, "cat", "c1", 2, A3C),
    Arrival(0, "cat", "c2", 2, RESNET),
    Arrival(0, "cat", "c3", 4, RESNET),
    Arrival(0, "cat", "c4", 1, TRANSFORMER),
    Arrival(0, "cat", "c5", 4, A3C),
    Arrival(5, "ann", "a4", 1, A3C),
    Arrival(5, "ben", "b3", 2, RESNET),
    Arrival(9, "cat", "c6", 8, RESNET),
    Arrival(14, "ben", "b4", 4, TRANSFORMER),
)
ENDS = {7: ("ann", "a2"), 11: ("cat", "c1"), 16: ("ben", "b2"), 19: ("ann", "a1")}


Runs = list[dict[str, frozenset[str]]]  # per quantum: server -> job keys
Filled = list[frozenset[str]]  # per quantum: jobs started between ticks, before its decision


@dataclass(frozen=True)
class MachineState:
    """What a machine holds once a quantum's plan is carried out."""

    # Job key -> node -> GPUs it holds there. Not which indices: the simulated nodes let go at
    # once, so a moved job starts in the quantum's own plan, where live it starts as its old
    # node reports it off, on what is free then.
    held: dict[str, dict[str, int]]
    accounts: dict[str, tuple[dict[str, float], dict[str, float]]]  # user -> entitled, credit
    passes: dict[str, float]  # job key -> its stride pass


States = list[MachineState]  # per quantum


def machine_state(machine: SplitStride) -> MachineState:
    held = {
        job.key: {
            node: len(stay.gpu_indices) for node, stay in job.stays.items() if stay.holds_gpus
        }
        for job in machine.index.resident_jobs()
    }
    return MachineState(
        {key: nodes for key, nodes in held.items() if nodes},
        {name: (dict(u.entitled), dict(u.credit)) for name, u in machine.users.items()},
        {key: job.stride_pass for key, job in machine.jobs.items()},
    )


def at(quantum: int) -> float:
    """The virtual time of a quantum's tick, as the service's fake clock reads it then."""
    return (START + timedelta(minutes=quantum)).timestamp()


def simulated(tree: ShareTree | None = None) -> tuple[Runs, Filled, States]:
    """The simulator's driver (the `gandiva-fair` policy): the runs of every quantum, what it
    started between ticks before each (as the simulator asks after every end and arrival), and
    its machine once each quantum is carried out."""
    table = load_throughputs()
    # The service's quantum: the kernel weighs moves against it (gfair.core.switch_costs).
    config = SchedulerConfig(trading=False, quantum_s=QUANTUM_S, shares=tree)
    policy = GandivaFairMachine(Cluster.of(SERVERS), TICKETS, table, config)
    users = {arrival.job_id: arrival.user for arrival in ARRIVALS}
    runs: Runs = []
    filled: Filled = []
    states: States = []
    for quantum in range(QUANTA):
        now = at(quantum)
        started: set[str] = set()
        if quantum in ENDS:
            _, job_id = ENDS[quantum]
            policy.finish(job_id, now)
            started |= policy.fill(now).keys()
        for arrival in ARRIVALS:
            if arrival.quantum == quantum:
                job = TraceJob(
                    arrival.job_id, arrival.user, arrival.gpus, now, 1e9, arrival.job_type
                )
                assert policy.submit(job, now).accepted
                started |= policy.fill(now).keys()
        filled.append(frozenset(f"{users[job_id]}.{job_id}" for job_id in started))
        decision = policy.plan(now)
        runs.append(
            {
                server: frozenset(f"{users[job_id]}.{job_id}" for job_id in jobs)
                for server, jobs in decision.runs.items()
                if jobs
            }
        )
        states.append(machine_state(policy.machine))
    return runs, filled, states


def settings_of(tmp_path: Path, shares_file: Path | None) -> SplitStrideSettings:
    return SplitStrideSettings(
        quantum_s=QUANTUM_S,  # its own timer never fires: the test ticks
        checkpoint_root=tmp_path,
        user_tickets=",".join(f"{user}={n:g}" for user, n in TICKETS.items()),
        shares_file=shares_file,
    )


@asynccontextmanager
async def service(
    bus: InMemoryBus,
    tmp_path: Path,
    clock: FakeClock,
    shares_file: Path | None,
    journal: Journal | None = None,
) -> AsyncIterator[SplitStrideService]:
    state = SplitStrideService(settings_of(tmp_path, shares_file), clock, journal)
    async with ServiceRuntime(state.service(), bus, settings=FAST):
        yield state


class Nodes:
    """The node executors: every start and suspend split-stride sends is confirmed at once."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.answered = 0

    async def answer(self, state: SplitStrideService) -> None:
        """Confirm every command until split-stride sends no more (a release may let a moved
        job start where the kernel put it) and every residency runs."""
        for _ in range(200):
            commands = self.commands()
            for command in commands[self.answered :]:
                await self.probe.publish(_answer(command))
            self.answered = len(commands)
            await self.probe.drained()
            if len(self.commands()) == self.answered and _settled(state):
                return
        raise AssertionError("split-stride kept sending commands")

    def commands(self) -> list[StartCommand | SuspendCommand]:
        return [
            data
            for _, data in self.probe.events("GFAIR_COMMANDS", NodeCommand)
            if isinstance(data, StartCommand | SuspendCommand)
        ]


def _answer(command: StartCommand | SuspendCommand) -> JobStarted | JobSuspended:
    if isinstance(command, StartCommand):
        return JobStarted(
            user=command.user,
            job_id=command.job_id,
            node_id=command.node_id,
            gpu_indices=command.gpu_indices,
            attempt=command.attempt,
        )
    return JobSuspended(
        user=command.user,
        job_id=command.job_id,
        node_id=command.node_id,
        attempt=command.attempt,
        reason=command.reason,
    )


def _settled(state: SplitStrideService) -> bool:
    return all(
        stay.phase is Phase.RUNNING
        for job in state.machine.jobs.values()
        for stay in job.stays.values()
    )


async def admit(probe: Probe, state: SplitStrideService, arrival: Arrival) -> None:
    data = submitted(arrival.user, arrival.job_id, arrival.gpus, job_type=arrival.job_type)
    envelope = Envelope.wrap(data, source="test")
    accepted = JobRecord.accepted(envelope, data)
    await save_job(await probe.bus.key_value(JOBS.name), accepted, None)
    await probe.publish(accepted.admission(), correlation_id=envelope.id)
    await eventually(lambda: f"{arrival.user}.{arrival.job_id}" in state.machine.jobs)


async def live(
    tmp_path: Path, shares_file: Path | None = None, journal: Journal | None = None
) -> tuple[Runs, Filled, States]:
    """The services' driver: the runs split-stride announced for every quantum, the jobs it
    started between ticks before each, and its machine once each quantum is carried out
    (`journal`: what its state machine was given)."""
    bus = InMemoryBus()
    probe = Probe(bus)
    clock = FakeClock(START)
    nodes = Nodes(probe)
    runs: Runs = []
    filled: Filled = []
    states: States = []
    async with service(bus, tmp_path, clock, shares_file, journal) as state:
        # Jobs first, servers after: the first quantum decides from the whole first batch, as
        # the simulator's does (no job starts on idle GPUs before the servers are known).
        for arrival in ARRIVALS:
            if arrival.quantum == 0:
                await admit(probe, state, arrival)
        for server in SERVERS:
            await probe.publish(registered(server.id, server.generation, server.gpus))
        await eventually(lambda: len(state.inventory) == len(SERVERS))
        for quantum in range(QUANTA):
            clock.at(60.0 * quantum)
            before = len(probe.payloads("GFAIR_COMMANDS", StartCommand))
            if quantum in ENDS:
                user, job_id = ENDS[quantum]
                await probe.publish(JobCompleted(user=user, job_id=job_id, attempt=1))
                await eventually(lambda key=f"{user}.{job_id}": key not in state.machine.jobs)
            for arrival in ARRIVALS:
                if arrival.quantum == quantum and quantum > 0:
                    await admit(probe, state, arrival)
            await probe.drained()
            filled.append(
                frozenset(
                    f"{c.user}.{c.job_id}"
                    for c in probe.payloads("GFAIR_COMMANDS", StartCommand)[before:]
                )
            )
            decided = len(probe.payloads("GFAIR_SCHED", ScheduleDecided))
            await state.on_tick()
            runs.append(
                {
                    d.server: frozenset(f"{r.user}.{r.job_id}" for r in d.running)
                    for d in probe.payloads("GFAIR_SCHED", ScheduleDecided)[decided:]
                    if d.quantum == quantum and d.running
                }
            )
            await nodes.answer(state)
            states.append(machine_state(state.machine))
    return runs, filled, states


def written_shares(tmp_path: Path, accounts: bool) -> Path | None:
    """The run's shares file (`SHARES`) when it has accounts, else None (flat tickets)."""
    if not accounts:
        return None
    shares_file = tmp_path / "shares.toml"
    shares_file.write_text(SHARES)
    return shares_file


@pytest.mark.timeout(120)
@pytest.mark.parametrize("accounts", [False, True], ids=["flat", "accounts"])
async def test_the_simulator_and_the_services_decide_alike_quantum_by_quantum(
    tmp_path: Path, accounts: bool
) -> None:
    shares_file = written_shares(tmp_path, accounts)
    if accounts:
        # The accounts change the decisions: the parity below is not a flat run's again.
        flat = ShareTree(
            members=dict.fromkeys(["ann", "ben"], ""), user_tickets={"ann": 1, "ben": 2}
        )
        assert simulated(parse_shares(SHARES))[0] != simulated(flat)[0]
    expected, expected_filled, expected_states = simulated(
        parse_shares(SHARES) if accounts else None
    )
    actual, actual_filled, actual_states = await live(tmp_path, shares_file)
    for quantum, (sim, svc) in enumerate(zip(expected, actual, strict=True)):
        assert actual_filled[quantum] == expected_filled[quantum], (
            f"before quantum {quantum}: services started {actual_filled[quantum]}, "
            f"the simulator {expected_filled[quantum]}"
        )
        assert svc == sim, f"quantum {quantum}: services ran {svc}, the simulator {sim}"
        machines = expected_states[quantum], actual_states[quantum]
        assert machines[1].held == machines[0].held, f"quantum {quantum}: GPUs held differ"
        assert machines[1].accounts == machines[0].accounts, f"quantum {quantum}: accounts"
        assert machines[1].passes == machines[0].passes, f"quantum {quantum}: passes differ"
    # Between ticks, idle GPUs went to waiting jobs at least once (a job ended).
    assert any(expected_filled)
    # The workload exercises what it is meant to: contention, gangs across servers, moves.
    assert any(len(run) == len(SERVERS) for run in expected)
    assert any("ben.b1" in jobs for run in expected for jobs in run.values())
    holders = [{job for jobs in run.values() for job in jobs} for run in expected]
    assert any(before - after for before, after in itertools.pairwise(holders))
    # And the accounts compared are worth comparing: users are owed and in debt.
    credits = [
        c
        for state in expected_states
        for _, credit in state.accounts.values()
        for c in credit.values()
    ]
    assert min(credits) < 0 < max(credits)
