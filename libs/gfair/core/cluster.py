"""The cluster: GPU servers grouped by generation, and the spec strings that describe them.

A spec such as ``v100:4x8,p100:4x8,k80:8x4`` means 4 V100 servers with 8 GPUs each, 4 P100
servers with 8 GPUs, and 8 K80 servers with 4 GPUs. Server ids are ``<generation>-<n>``,
numbered per generation from 0 in the order the spec lists them (a generation may appear more
than once, e.g. for servers of different sizes; numbering continues).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# Known generations, slowest to fastest. Unknown generations are allowed everywhere; they rank
# below every known one (we know nothing about their speed, so placement must not prefer them
# by rank alone) and among themselves by name.
KNOWN_GENERATIONS: tuple[str, ...] = (
    "k80",
    "p40",
    "p100",
    "t4",
    "v100",
    "a10",
    "a100",
    "l40s",
    "h100",
    "h200",
    "b200",
)
GENERATION_RANK: Mapping[str, int] = MappingProxyType(
    {name: rank for rank, name in enumerate(KNOWN_GENERATIONS)}
)

_GENERATION = re.compile(r"^[a-z0-9][a-z0-9_]{0,31}$")
_SERVER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def generation_rank(generation: str) -> tuple[int, str]:
    """Sort key, slowest first: known generations by `GENERATION_RANK`, unknown ones before."""
    return (GENERATION_RANK.get(generation, -1), generation)


@dataclass(frozen=True, slots=True)
class Server:
    id: str
    generation: str
    gpus: int

    def __post_init__(self) -> None:
        if not _SERVER_ID.match(self.id):
            raise ValueError(f"server id {self.id!r} must match [A-Za-z0-9_-]{{1,64}}")
        if not _GENERATION.match(self.generation):
            raise ValueError(
                f"server {self.id}: generation {self.generation!r} must be lower-case "
                "letters, digits or '_'"
            )
        if self.gpus < 1:
            raise ValueError(f"server {self.id}: gpus must be >= 1, got {self.gpus}")


@dataclass(frozen=True)
class Cluster:
    servers: tuple[Server, ...]
    _by_id: Mapping[str, Server] = field(init=False, repr=False, compare=False)
    _by_generation: Mapping[str, tuple[Server, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id: dict[str, Server] = {}
        by_generation: dict[str, list[Server]] = {}
        for server in self.servers:
            if server.id in by_id:
                raise ValueError(f"duplicate server id {server.id!r}")
            by_id[server.id] = server
            by_generation.setdefault(server.generation, []).append(server)
        ordered = sorted(by_generation, key=generation_rank)
        object.__setattr__(self, "_by_id", MappingProxyType(by_id))
        object.__setattr__(
            self,
            "_by_generation",
            MappingProxyType({g: tuple(by_generation[g]) for g in ordered}),
        )

    @classmethod
    def of(cls, servers: Iterable[Server]) -> Cluster:
        return cls(tuple(servers))

    def server(self, server_id: str) -> Server:
        try:
            return self._by_id[server_id]
        except KeyError:
            raise KeyError(f"unknown server {server_id!r}") from None

    def __contains__(self, server_id: object) -> bool:
        return server_id in self._by_id

    @property
    def generations(self) -> tuple[str, ...]:
        """Generations present, slowest first."""
        return tuple(self._by_generation)

    def by_generation(self, generation: str) -> tuple[Server, ...]:
        return self._by_generation.get(generation, ())

    def gpus_per_generation(self) -> dict[str, int]:
        return {g: sum(s.gpus for s in servers) for g, servers in self._by_generation.items()}

    def largest_server(self, generation: str) -> int:
        """GPUs of the largest server of `generation` (0 when it has none)."""
        return max((s.gpus for s in self.by_generation(generation)), default=0)

    @property
    def total_gpus(self) -> int:
        return sum(s.gpus for s in self.servers)


_SPEC_ITEM = re.compile(r"^(?P<gen>[^:]+):(?P<count>[0-9]+)x(?P<gpus>[0-9]+)$")


def parse_cluster_spec(spec: str) -> Cluster:
    """Parse ``gen:SERVERSxGPUS[,gen:SERVERSxGPUS...]`` into a `Cluster`.

    Raises `ValueError` naming the offending item (1-based position and text).
    """
    if not spec.strip():
        raise ValueError("cluster spec is empty; expected e.g. 'v100:4x8,k80:8x4'")
    servers: list[Server] = []
    next_index: dict[str, int] = {}
    for position, raw in enumerate(spec.split(","), start=1):
        item = raw.strip().lower()
        where = f"cluster spec item {position} ({raw.strip()!r})"
        match = _SPEC_ITEM.match(item)
        if match is None:
            raise ValueError(f"{where}: expected GENERATION:SERVERSxGPUS, e.g. 'v100:4x8'")
        generation = match["gen"].strip()
        if not _GENERATION.match(generation):
            raise ValueError(
                f"{where}: generation {generation!r} must be lower-case letters, digits or '_'"
            )
        count, gpus = int(match["count"]), int(match["gpus"])
        if count < 1:
            raise ValueError(f"{where}: server count must be >= 1")
        if gpus < 1:
            raise ValueError(f"{where}: GPUs per server must be >= 1")
        start = next_index.get(generation, 0)
        servers.extend(Server(f"{generation}-{start + i}", generation, gpus) for i in range(count))
        next_index[generation] = start + count
    return Cluster(tuple(servers))
