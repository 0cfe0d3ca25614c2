"""The environment that lets the parts of a gang across servers meet (gfair.events.gang_peers)."""

from __future__ import annotations

from gfair.events.gang_peers import PORT_BASE, PORT_SPAN, gang_environment, master_port

SERVERS = ("v100-3", "v100-1")


def part(node_id: str, attempt: int = 1) -> dict[str, str]:
    return gang_environment(
        user="alice",
        job_id="ddp",
        attempt=attempt,
        servers=SERVERS,
        node_id=node_id,
        master_addr="gpu-3.example",
        local_gpus=4,
    )


def test_every_part_gets_its_rank_and_the_same_meeting_point() -> None:
    first, second = part("v100-3"), part("v100-1")
    assert (first["NODE_RANK"], second["NODE_RANK"]) == ("0", "1")  # the placement's order
    for env in (first, second):
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "gpu-3.example"
        assert env["NNODES"] == env["PET_NNODES"] == "2"
        assert env["PET_NPROC_PER_NODE"] == "4"
    assert first["MASTER_PORT"] == second["MASTER_PORT"] == first["PET_MASTER_PORT"]
    assert PORT_BASE <= int(first["MASTER_PORT"]) < PORT_BASE + PORT_SPAN


def test_a_new_attempt_or_placement_meets_on_another_port() -> None:
    ports = {
        master_port("alice", "ddp", 1, SERVERS),
        master_port("alice", "ddp", 2, SERVERS),
        master_port("alice", "ddp", 1, tuple(reversed(SERVERS))),
    }
    assert len(ports) == 3


def test_a_job_on_one_server_or_a_node_outside_the_gang_gets_nothing() -> None:
    alone = gang_environment(
        user="alice",
        job_id="j",
        attempt=1,
        servers=("v100-0",),
        node_id="v100-0",
        master_addr="gpu-0",
        local_gpus=2,
    )
    assert alone == {}
    assert part("v100-9") == {}
