"""A state machine's journal: every input it was given and what came of it, in order; and the
replay of recorded inputs into another machine. A driver records a live run's journal; fed to a
machine restored alike, the same inputs must give the same outputs (no decision is taken
outside the machine, and nothing it decides depends on anything but its inputs)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .events import Event, Tick
from .machine import SplitStride
from .plan import QuantumPlan, Reply

Input = Event | Tick
Output = Reply | QuantumPlan


@dataclass
class Recording:
    """A journal (`SplitStride(journal=...)`) that keeps every entry in memory."""

    entries: list[tuple[Input, Output]] = field(default_factory=list)

    def __call__(self, given: Input, result: Output) -> None:
        self.entries.append((given, result))

    @property
    def inputs(self) -> list[Input]:
        return [given for given, _ in self.entries]

    @property
    def outputs(self) -> list[Output]:
        return [result for _, result in self.entries]


def replay(machine: SplitStride, inputs: Iterable[Input]) -> list[Output]:
    """Feed `inputs` to `machine` in order; what each gave."""
    return [
        machine.tick(given.now, given.heard_until)
        if isinstance(given, Tick)
        else machine.apply(given)
        for given in inputs
    ]
