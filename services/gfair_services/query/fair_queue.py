"""Questions waiting for the query service, taken in turn across tenants.

Each tenant has a queue of its own, bounded (`QueueFull` when it would overflow). A question
is taken when a service slot is free, its tenant has fewer than `per_tenant` questions being
answered, and its tenant's token bucket holds a token (`rate` a second, up to `burst` saved
up). Tenants that can go take turns, one question each, in the order they last had one taken
(round robin), so a tenant asking three hundred questions at once waits behind its own
questions only: another tenant's question is taken within one turn of a slot coming free.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")


class QueueFull(Exception):
    """The tenant has as many questions waiting as it may; the message says so."""


@dataclass(frozen=True, slots=True)
class Limits:
    slots: int  # questions answered at once, all tenants together
    per_tenant: int  # questions one tenant has answered at once
    rate: float  # questions a second one tenant is started on, on average
    burst: int  # tokens a tenant may save up: questions started at once after a pause
    queue: int  # questions one tenant may have waiting

    def __post_init__(self) -> None:
        if min(self.slots, self.per_tenant, self.burst, self.queue) < 1 or self.rate <= 0:
            raise ValueError(f"query limits must be positive: {self}")


@dataclass(slots=True)
class _Tenant(Generic[Item]):
    tokens: float
    refilled_at: float
    waiting: deque[Item] = field(default_factory=deque)
    running: int = 0


class FairQueue(Generic[Item]):
    def __init__(self, limits: Limits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._limits = limits
        self._clock = clock
        # Every tenant with a question waiting or being answered, in turn order: the next
        # turn goes to the first that can go, which then moves to the back.
        self._tenants: OrderedDict[str, _Tenant[Item]] = OrderedDict()
        self._running = 0
        self._changed = asyncio.Event()

    @property
    def running(self) -> int:
        return self._running

    def waiting(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return len(state.waiting) if state is not None else 0

    def put(self, tenant: str, item: Item) -> None:
        """Queue `item` for `tenant`; `QueueFull` if the tenant's queue is full."""
        state = self._tenants.get(tenant)
        if state is None:
            state = _Tenant[Item](tokens=float(self._limits.burst), refilled_at=self._clock())
            self._tenants[tenant] = state
            # First in turn: it has had none yet.
            self._tenants.move_to_end(tenant, last=False)
        if len(state.waiting) >= self._limits.queue:
            raise QueueFull(
                f"too many questions in flight for {tenant}; retry later "
                f"(at most {self._limits.queue} wait their turn)"
            )
        state.waiting.append(item)
        self._changed.set()

    async def take(self) -> tuple[str, Item]:
        """The next question to answer, with its tenant, once one may start; call `done`
        with the tenant when its answer is sent."""
        while True:
            self._changed.clear()
            wake_in = self._take_turn()
            if isinstance(wake_in, tuple):
                return wake_in
            with contextlib.suppress(TimeoutError):  # a tenant's token came
                await asyncio.wait_for(self._changed.wait(), wake_in)

    def done(self, tenant: str) -> None:
        state = self._tenants[tenant]
        state.running -= 1
        self._running -= 1
        self._forget_if_idle(tenant, state)
        self._changed.set()

    def _take_turn(self) -> tuple[str, Item] | float | None:
        """A question whose turn it is, else how long until a token may let one go (None: not
        before something changes)."""
        if self._running >= self._limits.slots:
            return None
        now = self._clock()
        wake_in: float | None = None
        for tenant, state in list(self._tenants.items()):
            if not state.waiting and not state.running:
                self._forget_if_idle(tenant, state)
                continue
            if not state.waiting or state.running >= self._limits.per_tenant:
                continue
            self._refill(state, now)
            if state.tokens < 1:
                until = (1 - state.tokens) / self._limits.rate
                wake_in = until if wake_in is None else min(wake_in, until)
                continue
            state.tokens -= 1
            state.running += 1
            self._running += 1
            self._tenants.move_to_end(tenant)
            return tenant, state.waiting.popleft()
        return wake_in

    def _refill(self, state: _Tenant[Item], now: float) -> None:
        limits = self._limits
        state.tokens = min(limits.burst, state.tokens + (now - state.refilled_at) * limits.rate)
        state.refilled_at = now

    def _forget_if_idle(self, tenant: str, state: _Tenant[Item]) -> None:
        # Kept while its bucket is short of full, so being idle briefly gains it nothing.
        if state.waiting or state.running:
            return
        self._refill(state, self._clock())
        if state.tokens >= self._limits.burst:
            del self._tenants[tenant]
