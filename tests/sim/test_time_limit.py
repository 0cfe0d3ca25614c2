"""A trace's `time_limit_s` (`gfair submit --time-limit`): the gandiva-fair policy's machine ends
the job once it ran that long on GPUs, as the live scheduler does, and the job fails."""

from __future__ import annotations

import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.throughput import ThroughputTable
from gfair.sim.gandiva_fair_machine import GandivaFairMachine
from gfair.sim.simulator import SimConfig, Simulator
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import TraceError, parse_trace

TRACE = """submit_time_s,user,gpus,duration_s,job_id,time_limit_s,after_ok
0,ann,1,5000,long,600,
0,bob,1,1000,short,,
0,ann,1,100,next,,long
"""


def test_a_job_past_its_time_limit_fails_after_that_much_running_time(
    throughput: ThroughputTable, speeds: SpeedModel
) -> None:
    cluster = parse_cluster_spec("v100:1x1")
    policy = GandivaFairMachine(cluster, {}, throughput)
    result = Simulator(
        parse_trace(TRACE.splitlines()), cluster, policy, speeds, SimConfig(quantum_s=60)
    ).run()
    jobs = {job.id: job for job in result.jobs}
    long = jobs["long"]
    assert long.status == "failed"
    assert long.reason.startswith("time limit 10m reached after 10m")
    assert long.start_s is not None and long.end_s is not None
    # It shared the one GPU with bob's job: more wall time passed than it ran.
    assert long.end_s - long.start_s > 600 + 60
    assert jobs["short"].status == "completed"
    # A job that waited for it to complete will not run.
    assert jobs["next"].status == "rejected"


def test_a_trace_refuses_a_time_limit_that_is_not_a_positive_number() -> None:
    with pytest.raises(TraceError, match="time_limit_s"):
        parse_trace(["submit_time_s,user,gpus,duration_s,time_limit_s", "0,ann,1,10,-5"])
    assert parse_trace(TRACE.splitlines()).jobs[0].time_limit_s == 600.0
