from __future__ import annotations

import pytest

from gfair.core.cluster import Cluster, Server, generation_rank, parse_cluster_spec


def test_spec_gives_servers_per_generation_with_ids_numbered_per_generation() -> None:
    cluster = parse_cluster_spec("v100:4x8,p100:4x8,k80:8x4")

    assert [s.id for s in cluster.by_generation("v100")] == [f"v100-{i}" for i in range(4)]
    assert cluster.server("k80-7") == Server("k80-7", "k80", 4)
    assert cluster.gpus_per_generation() == {"k80": 32, "p100": 32, "v100": 32}
    assert cluster.total_gpus == 96
    assert cluster.generations == ("k80", "p100", "v100")  # slowest first
    assert cluster.largest_server("k80") == 4


def test_a_generation_listed_twice_continues_its_numbering() -> None:
    cluster = parse_cluster_spec("V100:1x8, v100:2x4")

    assert [(s.id, s.gpus) for s in cluster.by_generation("v100")] == [
        ("v100-0", 8),
        ("v100-1", 4),
        ("v100-2", 4),
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty"),
        ("v100", "item 1 ('v100'): expected GENERATION:SERVERSxGPUS"),
        ("v100:4x8,k80:4", "item 2 ('k80:4')"),
        ("v100:0x8", "server count must be >= 1"),
        ("v100:2x0", "GPUs per server must be >= 1"),
        ("v-100:2x8", "generation 'v-100'"),
        ("v100:-1x8", "expected GENERATION:SERVERSxGPUS"),
    ],
)
def test_malformed_specs_are_rejected_naming_the_item(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_cluster_spec(spec)
    assert message in str(error.value)


def test_unknown_generations_are_allowed_and_rank_below_known_ones() -> None:
    cluster = parse_cluster_spec("h100:1x8,mystery:1x8,k80:1x4")

    assert cluster.generations == ("mystery", "k80", "h100")
    assert generation_rank("mystery") < generation_rank("k80") < generation_rank("h200")


def test_cluster_rejects_duplicate_ids_and_bad_servers() -> None:
    with pytest.raises(ValueError, match="duplicate server id 'a'"):
        Cluster((Server("a", "k80", 4), Server("a", "k80", 4)))
    with pytest.raises(ValueError, match="gpus must be >= 1"):
        Server("a", "k80", 0)
    with pytest.raises(KeyError, match="unknown server 'nope'"):
        parse_cluster_spec("k80:1x4").server("nope")
