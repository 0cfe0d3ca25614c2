"""End to end, on random traces: gandiva-fair never leaves a GPU idle that a waiting job fits.

The kernel's own property test (`tests/core/test_scheduler.py`) checks each decision; this one
replays whole traces, so it also covers what happens between decisions (backfill when a job
ends or arrives mid-quantum) and the simulator's execution of each decision.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gfair.core.cluster import parse_cluster_spec
from gfair.core.throughput import ThroughputTable
from gfair.sim.replay import ReplayOptions, replay

from .workloads import Row, trace_of

CLUSTERS = ("v100:1x4,k80:2x4", "v100:2x2,p100:1x4,k80:1x8", "p100:2x4", "v100:1x8,k80:3x4")
TYPES = ("", "ResNet-50 (batch size 64)", "LM (batch size 80)", "Recommendation (batch size 1024)")

rows = st.lists(
    st.builds(
        Row,
        submit_s=st.integers(0, 4 * 3600).map(float),
        user=st.sampled_from(("ann", "bob", "cat")),
        gpus=st.sampled_from((1, 1, 2, 4, 8)),
        duration_s=st.integers(30, 6 * 3600).map(float),
        job_type=st.sampled_from(TYPES),
    ),
    min_size=1,
    max_size=24,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    jobs=rows,
    cluster=st.sampled_from(CLUSTERS),
    quantum=st.sampled_from((60.0, 360.0)),
    trading=st.booleans(),
)
def test_no_gpu_idles_while_a_job_that_fits_it_waits(
    throughput: ThroughputTable, jobs: list[Row], cluster: str, quantum: float, trading: bool
) -> None:
    trace = trace_of(sorted(jobs, key=lambda row: row.submit_s))
    options = ReplayOptions(quantum_s=quantum, trading=trading)
    summary = replay(trace, parse_cluster_spec(cluster), throughput, options).report.summary
    assert summary.idle_while_fitting in (None, 0.0), summary
