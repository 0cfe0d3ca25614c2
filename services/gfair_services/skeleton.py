"""One service skeleton, declared: what a cluster service consumes and runs, built in one place.

A service names its handlers (`Consumes`), its timers (`Every`) and its start hook; `declare`
builds the `Service` every cluster service has: the whole cluster's topology at the replicas of
``GFAIR_REPLICAS``, each consumer durable as ``<service>-<name>`` with the ack wait of
``GFAIR_ACK_WAIT_S``. What differs between services is then only what they declare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gfair.bus.service import (
    EventHandler,
    InvalidHandler,
    Service,
    SettleHook,
    StartupHook,
    TimerCallback,
)
from gfair.core.kernel import DEFAULT_QUANTUM_S
from gfair.events.envelope import EventData
from gfair_services.topology import TopologySettings, cluster_topology

T = TypeVar("T")


class QuantumSettings(BaseSettings):
    """The quantum, one setting (``GFAIR_QUANTUM_S``) for every service that paces itself by it."""

    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    quantum_s: float = Field(
        default=DEFAULT_QUANTUM_S,
        gt=0,
        description="Length of a time-slice quantum: split-stride decides once a quantum, the "
        "auction reads its usage twice a quantum in the shares file's decayed mode, and a job "
        "reports its progress a few times a quantum unless progress_interval_s says",
    )


class ThroughputsSettings(BaseSettings):
    """The throughput table a service seeds its speed estimates with."""

    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    throughputs: Path | None = Field(
        default=None,
        description="Gavel throughput table (default: the measurements packaged with gfair)",
    )


@dataclass(frozen=True, slots=True)
class Consumes:
    """A handler and the events it takes (None: those its annotation names)."""

    name: str
    handler: EventHandler
    events: tuple[type[EventData], ...] | None = None
    # Completes the writes the batch's handlers deferred (`Route.settle`).
    settle: SettleHook | None = None
    on_invalid: InvalidHandler | None = None
    # Frequent reports handled without a span each (`Route.untraced`).
    untraced: tuple[type[EventData], ...] = ()


@dataclass(frozen=True, slots=True)
class Every:
    """A timer: `callback` every `interval_s`, first after `first_in()` when given."""

    name: str
    interval_s: float
    callback: TimerCallback
    first_in: Callable[[], float] | None = None


def declare(
    name: str,
    settings: TopologySettings,
    *,
    start: StartupHook,
    consumes: Sequence[Consumes],
    timers: Sequence[Every] = (),
) -> Service:
    """The `Service` called `name` running `consumes` and `timers` after `start`."""
    service = Service(name, topology=cluster_topology(replicas=settings.replicas))
    service.on_start(start)
    for consumer in consumes:
        service.add_handler(
            consumer.handler,
            durable=f"{name}-{consumer.name}",
            accepts=consumer.events,
            name=consumer.name,
            on_invalid=consumer.on_invalid,
            ack_wait_s=settings.ack_wait_s,
            settle=consumer.settle,
            untraced=consumer.untraced,
        )
    for timer in timers:
        service.add_timer(
            timer.interval_s, timer.callback, name=timer.name, first_in=timer.first_in
        )
    return service


def started(value: T | None, what: str) -> T:
    """`value`, opened by a service's start hook; before it ran, a `RuntimeError` naming `what`."""
    if value is None:
        raise RuntimeError(f"{what} has not started")
    return value
