"""A live run replayed: split-stride on the in-memory bus, with a fake clock, through the parity
test's workload (arrivals into a backlog, gangs across servers, moves, ends), records every input
its state machine was given and every plan it got (`SplitStride`'s journal); fed to a fresh
machine with the same settings, those inputs give the same plans, one by one. Nothing the
service carries out was decided outside the machine, and nothing the machine decides depends on
anything but its inputs (docs/design.md §2.7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gfair.core.scheduler import (
    Admitted,
    QuantumPlan,
    Recording,
    Releases,
    Reply,
    SplitStride,
    Started,
    Suspended,
    Tick,
    replay,
)
from gfair.core.throughput import ThroughputEstimator
from gfair.journal import JournalFile, replay_file
from gfair_services.profiler.seed import seed_table
from gfair_services.split_stride import SplitStrideSettings

from .test_parity import QUANTA, TICKETS, live, settings_of, written_shares


def fresh(settings: SplitStrideSettings) -> SplitStride:
    """A machine as split-stride starts one on an empty record."""
    estimator = ThroughputEstimator(seed_table(settings.throughputs), alpha=1.0)
    return SplitStride(settings.machine_config(), estimator)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("accounts", [False, True], ids=["flat", "accounts"])
async def test_a_live_runs_recorded_inputs_give_the_same_plans_again(
    tmp_path: Path, accounts: bool
) -> None:
    shares_file = written_shares(tmp_path, accounts)
    recording = Recording()
    await live(tmp_path, shares_file, recording)
    settings = settings_of(tmp_path, shares_file)

    assert replay(fresh(settings), recording.inputs) == recording.outputs

    # The run is worth replaying: every quantum, admissions that started at once, the nodes'
    # reports, and quanta that stopped jobs and started others.
    inputs = recording.inputs
    assert sum(isinstance(given, Tick) for given in inputs) == QUANTA
    assert any(isinstance(given, Admitted) for given in inputs)
    assert any(isinstance(given, Started) for given in inputs)
    # The nodes' reports of what let go come in together (split-stride hands in a batch's).
    released = [r for given in inputs if isinstance(given, Releases) for r in given.reports]
    assert any(isinstance(report, Suspended) for report in released)
    plans = [result for result in recording.outputs if isinstance(result, QuantumPlan)]
    assert any(turn.stops and turn.starts for plan in plans for turn in plan.turns)
    assert any(plan.placed for plan in plans)
    replies = [result for result in recording.outputs if isinstance(result, Reply)]
    assert any(reply.starts.turns for reply in replies)


async def test_other_settings_give_other_plans(tmp_path: Path) -> None:
    # The replay's check can fail: the same inputs under other tickets decide otherwise.
    recording = Recording()
    await live(tmp_path, None, recording)
    other = settings_of(tmp_path, None).model_copy(
        update={"user_tickets": {user: 1.0 for user in TICKETS}}
    )
    assert replay(fresh(other), recording.inputs) != recording.outputs


@pytest.mark.timeout(120)
async def test_a_live_run_journaled_to_a_file_replays_from_it(tmp_path: Path) -> None:
    # `GFAIR_JOURNAL`: the same inputs and outputs, on disk, with what the machine started from.
    path = tmp_path / "live.jsonl"
    journal = JournalFile(path)
    await live(tmp_path, None, journal)
    journal.close()
    replayed = replay_file(path)
    assert replayed.difference is None
    assert replayed.runs == 1 and replayed.inputs > QUANTA
