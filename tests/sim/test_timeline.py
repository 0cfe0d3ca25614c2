from __future__ import annotations

import io
import json

from gfair.core.cluster import parse_cluster_spec
from gfair.core.throughput import ThroughputTable
from gfair.sim.replay import ReplayOptions, replay
from gfair.sim.timeline import TimelineWriter

from .workloads import Row, trace_of


def test_one_line_per_quantum_per_busy_server(throughput: ThroughputTable) -> None:
    trace = trace_of(
        [Row(0, "a", 1, 150), Row(0, "b", 1, 150), Row(0, "c", 8, 100), Row(500, "a", 2, 30)]
    )
    cluster = parse_cluster_spec("v100:1x8,k80:1x4")
    stream = io.StringIO()
    outcome = replay(
        trace, cluster, throughput, ReplayOptions(), timeline=TimelineWriter(stream, cluster)
    )
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines
    generation = {server.id: server.generation for server in cluster.servers}
    seen: dict[str, list[float]] = {}
    for line in lines:
        assert set(line) == {"t", "server", "generation", "running"}
        assert line["generation"] == generation[line["server"]]
        assert line["running"], "idle servers are left out"
        for job_id in line["running"]:
            seen.setdefault(job_id, []).append(line["t"])
    for job in outcome.result.jobs:
        assert job.start_s is not None and job.end_s is not None
        times = seen[job.id]
        # A job shows up from the quantum it started in to the one it ended in.
        assert min(times) == job.start_s
        assert max(times) < job.end_s
    starts = sorted({line["t"] for line in lines})
    assert starts[0] == 0.0
    # Quanta are 60 s apart until the idle gap, after which the grid restarts at 500 s.
    assert all(t % 60 == 0 for t in starts if t < 500)
    assert 500.0 in starts and max(starts) == 500.0
