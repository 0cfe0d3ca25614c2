"""Journals on disk: the scheduler machine's inputs and outputs as JSON Lines, and their replay.

A journal file holds one or more runs of a machine (`gfair.core.scheduler.SplitStride`). Each
run begins with a header line, ``{"journal": 1, ...}``: what the machine was built from (its
config less the tickets function, the users' tickets, the throughput table, the state it was
restored from). Each following line is one input and what the machine answered,
``{"in": ..., "out": ...}``. Values are the core's frozen dataclasses, written by type name
(``{"@": "Admitted", ...}``), so the encoding follows the dataclasses without a schema of its
own. `replay` builds a fresh machine from each header, feeds it the inputs and compares every
output: the machine decides from its inputs alone, so a difference is a change of behaviour.

Recorded by `gfair simulate --journal PATH` (the gandiva-fair policy) and by split-stride
with ``GFAIR_JOURNAL=PATH``; replayed by `gfair replay PATH` and in CI (`tests/data/journals`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import IO, Any

from gfair.core import cluster, switch_costs
from gfair.core.scheduler import (
    QuantumPlan,
    Reply,
    Saved,
    SchedulerConfig,
    SplitStride,
    config,
    events,
    machine,
    plan,
    residency,
)
from gfair.core.scheduler.journal import Input, replay
from gfair.core.throughput import ThroughputEstimator

VERSION = 1
# The modules whose dataclasses and enums a journal may name.
_MODULES = (events, plan, residency, machine, config, switch_costs, cluster)
_TYPES: dict[str, type] = {
    name: value
    for module in _MODULES
    for name, value in vars(module).items()
    if isinstance(value, type)
    and (dataclasses.is_dataclass(value) or issubclass(value, Enum))
    and value.__module__ == module.__name__
}


def encode(value: Any) -> Any:
    """`value` as JSON data: dataclasses and enums by type name, sequences as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"@": type(value).__name__}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.init and not callable(item):
                out[f.name] = encode(item)
        return out
    if isinstance(value, Enum):
        if _TYPES.get(type(value).__name__) is not type(value):
            return value.value  # a driver's enum (an event's state): the machine reads its value
        return {"@": type(value).__name__, "value": value.value}
    if isinstance(value, Mapping):
        if all(isinstance(key, str) for key in value):
            return {key: encode(item) for key, item in value.items()}
        return {"@items": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {"@set": sorted((encode(item) for item in value), key=json.dumps)}
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    return value


def decode(data: Any) -> Any:
    """The value `encode` wrote: sequences come back as tuples, sets as frozensets."""
    if isinstance(data, list):
        return tuple(decode(item) for item in data)
    if not isinstance(data, dict):
        return data
    if "@items" in data:
        return {decode(k): decode(v) for k, v in data["@items"]}
    if "@set" in data:
        return frozenset(decode(item) for item in data["@set"])
    name = data.get("@")
    if name is None:
        return {key: decode(item) for key, item in data.items()}
    cls = _TYPES.get(name)
    if cls is None:
        raise JournalError(f"unknown type {name!r}")
    if issubclass(cls, Enum):
        return cls(data["value"])
    return cls(**{key: decode(item) for key, item in data.items() if key != "@"})


class JournalError(ValueError):
    """A journal that cannot be read."""


@dataclass(frozen=True)
class Header:
    """What a run's machine was built from."""

    config: SchedulerConfig
    tickets: Mapping[str, float]
    default_tickets: float
    throughput: Mapping[str, Mapping[str, float]]
    saved: Saved | None = None

    def machine(self) -> SplitStride:
        tickets, default = dict(self.tickets), self.default_tickets
        built = replace(self.config, tickets_of=lambda user: tickets.get(user, default))
        # alpha 1 in both drivers: each profile replaces the last.
        estimator = ThroughputEstimator(self.throughput, alpha=1.0)
        return SplitStride(built, estimator, self.saved)


class JournalFile:
    """A machine's journal (`SplitStride(journal=...)`) appended to a JSON Lines file; `begin`
    writes a run's header before the machine takes its first input."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._out: IO[str] | None = None

    def begin(self, header: Header) -> None:
        if header.config.shares is not None:
            raise ValueError("a journal records flat tickets only, not a shares file")
        line = {"journal": VERSION, **{k: encode(v) for k, v in vars(header).items()}}
        self._write(line)

    def __call__(self, given: Input, result: Reply | QuantumPlan) -> None:
        self._write({"in": encode(given), "out": encode(result)})

    def _write(self, line: dict[str, Any]) -> None:
        if self._out is None:
            self._out = self.path.open("a", encoding="utf-8")
        self._out.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._out.flush()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


@dataclass(frozen=True)
class Difference:
    line: int  # in the journal file, from 1
    given: str  # the input's type
    path: str  # where in the output the replay differs
    recorded: Any
    replayed: Any

    def __str__(self) -> str:
        return (
            f"line {self.line}: the output of {self.given} differs at {self.path or '.'}: "
            f"recorded {json.dumps(self.recorded)}, replayed {json.dumps(self.replayed)}"
        )


@dataclass(frozen=True)
class Replayed:
    runs: int
    inputs: int
    difference: Difference | None  # the first one; None: every output matched


def replay_file(path: Path) -> Replayed:
    """Feed each run's inputs to a fresh machine built from its header; the first difference."""
    runs = inputs = 0
    current: SplitStride | None = None
    for number, line in _lines(path):
        if "journal" in line:
            if line["journal"] != VERSION:
                raise JournalError(f"line {number}: journal version {line['journal']}")
            fields = {k: decode(v) for k, v in line.items() if k != "journal"}
            current, runs = Header(**fields).machine(), runs + 1
            continue
        if current is None:
            raise JournalError(f"line {number}: an input before any header")
        given = decode(line["in"])
        (result,) = replay(current, [given])
        inputs += 1
        replayed = json.loads(json.dumps(encode(result)))
        where = _first_difference(line["out"], replayed, "")
        if where is not None:
            at, recorded, got = where
            return Replayed(
                runs, inputs, Difference(number, type(given).__name__, at, recorded, got)
            )
    return Replayed(runs, inputs, None)


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as lines:
        for number, text in enumerate(lines, 1):
            if text.strip():
                try:
                    yield number, json.loads(text)
                except ValueError as error:
                    raise JournalError(f"line {number}: {error}") from None


def _first_difference(a: Any, b: Any, path: str) -> tuple[str, Any, Any] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            found = _first_difference(a.get(key), b.get(key), f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    return None if a == b else (path, a, b)
