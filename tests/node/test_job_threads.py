"""A job's thread share: the operator's CPU limit where set, else the node's CPUs per GPU."""

from __future__ import annotations

from gfair.node.job_threads import job_threads, threads_per_gpu


def test_the_cpu_limit_is_the_share_where_the_operator_set_one() -> None:
    assert threads_per_gpu(6.0, node_gpus=8, cpus=96) == 6.0
    assert job_threads(6.0, 2) == 12


def test_otherwise_the_nodes_cpus_are_divided_among_its_gpus() -> None:
    assert threads_per_gpu(None, node_gpus=8, cpus=96) == 12.0
    assert job_threads(threads_per_gpu(None, node_gpus=2, cpus=2), 1) == 1
    # Fewer CPUs than GPUs: every job still gets a thread; a job on no GPU one GPU's worth.
    assert job_threads(threads_per_gpu(None, node_gpus=8, cpus=4), 1) == 1
    assert job_threads(threads_per_gpu(None, node_gpus=8, cpus=4), 3) == 1
    assert job_threads(threads_per_gpu(None, node_gpus=8, cpus=4), 0) == 1
    assert job_threads(threads_per_gpu(None, node_gpus=3, cpus=16), 3) == 16
