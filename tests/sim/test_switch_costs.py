"""Each job is charged its own switching costs (`TraceJob.costs`), and reports count moves."""

from __future__ import annotations

import io

import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.switch_costs import SwitchCosts
from gfair.sim.report import build_report
from gfair.sim.simulator import SimConfig, SimResult, Simulator
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import parse_trace

from .scripted import Runs, Scripted


def _moved_every_minute(csv: str, speeds: SpeedModel, costs: SwitchCosts) -> SimResult:
    """Every job runs alone on v100-0 for the first quantum, then on v100-1."""

    def script(now: float, active: list[str]) -> Runs:
        return {("v100-0" if now < 60 else "v100-1"): tuple(active)}

    trace = parse_trace(io.StringIO(csv), source="costs.csv")
    cluster = parse_cluster_spec("v100:2x2")
    return Simulator(trace, cluster, Scripted(script), speeds, SimConfig(costs=costs)).run()


def test_a_job_with_its_own_move_cost_is_charged_it_and_the_others_the_runs(
    speeds: SpeedModel,
) -> None:
    csv = "submit_time_s,user,gpus,duration_s,job_id,move_s\n0,a,1,200,own,40\n0,b,1,200,run,\n"
    result = _moved_every_minute(csv, speeds, SwitchCosts(resume_s=1.0, migration_s=10.0))
    ends = {job.id: job.end_s for job in result.jobs}
    # 60 s on v100-0, then the move: 140 s of work left after 40 s (its own) or 10 s (the run's)
    assert ends["own"] == pytest.approx(60 + 40 + 140)
    assert ends["run"] == pytest.approx(60 + 10 + 140)


def test_reports_count_moves_per_job_and_per_running_hour(speeds: SpeedModel) -> None:
    csv = "submit_time_s,user,gpus,duration_s\n0,a,1,3600\n"
    result = _moved_every_minute(csv, speeds, SwitchCosts(resume_s=0.0, migration_s=0.0))
    summary = build_report(result, trace="costs.csv").summary
    assert summary.migrations == 1
    assert summary.moves_per_job == 1.0
    assert summary.moves_per_running_hour == pytest.approx(1.0)  # one move in its one hour


def test_a_negative_cost_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        SwitchCosts(resume_s=-1.0)
