"""GPU time held, per user and pool: what `gfair users` shows, and the corrections the next
quantum's booking (`kernel.settle`) makes to what the last one charged.

- `seconds`: GPU-seconds each user's jobs held, per pool; charged at every tick (since the last
  tick, or since the GPUs were taken) and when a job lets go mid-quantum.
- `overrun`: GPU-seconds a job held after it was told to stop (from the suspend until its node
  reported it off), charged to its user at the next tick (`kernel.Snapshot.overrun`).
- `unheld`: GPU-seconds the last booked quantum charged a user for a job it ran that did not
  hold its GPUs yet (from the tick to the job's start report), given back at the next tick
  (`kernel.Snapshot.unheld`), at most what the quantum charged (`refundable`).

Overrun and unheld are in memory only: a restart forgets at most one tick's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gfair.core.kernel import Decision

from .residency import Phase, SchedulerJob, Stay

Seconds = dict[str, dict[str, float]]  # user -> pool -> GPU-seconds


def _add(book: Seconds, user: str, pool: str, seconds: float) -> None:
    per_pool = book.setdefault(user, {})
    per_pool[pool] = per_pool.get(pool, 0.0) + seconds


class Meter:
    def __init__(
        self,
        quantum_s: float,
        gap_s: float,
        seconds: Mapping[str, Mapping[str, float]],
        since: float,
        last_tick_at: float | None,
    ) -> None:
        self.quantum_s = quantum_s
        self.gap_s = gap_s
        self.seconds: Seconds = {u: dict(p) for u, p in seconds.items()}
        self.since = since
        self.last_tick_at = last_tick_at
        self.overrun: Seconds = {}
        self.unheld: Seconds = {}
        # The jobs the last booked quantum charged (run on entitlement), and what of that
        # charge may still be given back.
        self.charged_jobs: frozenset[str] = frozenset()
        self._charged: Mapping[str, Mapping[str, float]] = {}  # user -> pool -> GPUs
        self.refundable: Seconds = {}  # (by user as asked: `_refundable`)

    def _elapsed(self, stay: Stay, until: float) -> float:
        since = stay.since if self.last_tick_at is None else max(stay.since, self.last_tick_at)
        return max(0.0, min(until - since, self.gap_s))

    def tick(
        self, residents: Iterable[SchedulerJob], generations: Mapping[str, str], now: float
    ) -> list[tuple[SchedulerJob, Stay]]:
        """A tick at `now`: each residency of `residents` is charged as `held` (running) or
        `overran` (suspending) says, in its server's pool (`generations`: server -> pool; else
        the job's); what is not running (told to start or to stop, unconfirmed), in order."""
        unsettled: list[tuple[SchedulerJob, Stay]] = []
        running = Phase.RUNNING
        for job in residents:
            for stay in job.stays.values():
                pool = generations.get(stay.node_id)
                if pool is None:
                    pool = job.generation or "unknown"
                if stay.phase is not running:
                    unsettled.append((job, stay))
                    if not stay.holds_gpus:
                        self.overran(job, stay, pool, now)
                    continue  # (a start holds its GPUs from its report on: `held`)
                self.held(job, stay, pool, now)
        self.last_tick_at = now
        return unsettled

    def held(self, job: SchedulerJob, stay: Stay, pool: str, until: float) -> None:
        """`stay` held its GPUs until `until` (since the last tick, or since it took them)."""
        if stay.phase is Phase.STARTING:
            return  # it holds its GPUs from its start report on (`started_late`)
        _add(self.seconds, job.user, pool, len(stay.gpu_indices) * self._elapsed(stay, until))

    def overran(self, job: SchedulerJob, stay: Stay, pool: str, until: float) -> None:
        """A suspending stay's GPU time up to `until` (since its suspend, or the last tick):
        its node has not reported it off, so the job still holds those GPUs, whatever the
        decision said. A stop of a start never confirmed holds nothing: the node refused it,
        or its start report comes first and the stop's time counts from there."""
        if stay.unconfirmed:
            return
        elapsed = self._elapsed(stay, until)
        if elapsed <= 0.0:
            return
        held = len(stay.gpu_indices) * elapsed
        _add(self.seconds, job.user, pool, held)
        _add(self.overrun, job.user, pool, held)

    def started_late(self, job: SchedulerJob, stay: Stay, pool: str, at: float) -> None:
        """The start was told at `stay.since` and confirmed at `at`: the job holds its GPUs from
        then on. If the last quantum charged it, the seconds since the tick it did not hold
        are given back to its user (at most what the quantum charged it there)."""
        stay.since = max(stay.since, at)
        if job.key not in self.charged_jobs or self.last_tick_at is None:
            return
        late = stay.since - self.last_tick_at
        if late <= 0.0:
            return  # (nothing to give back: started at the tick)
        left = self._refundable(job.user)
        given = min(len(stay.gpu_indices) * min(late, self.quantum_s), left.get(pool, 0))
        if given <= 0.0:
            return
        left[pool] -= given
        _add(self.unheld, job.user, pool, given)

    def quanta(self) -> tuple[Seconds, Seconds]:
        """The overrun and unheld GPU-quanta for the next booking."""
        overrun, unheld = (
            {
                user: {pool: held / self.quantum_s for pool, held in pools.items()}
                for user, pools in seconds.items()
            }
            for seconds in (self.overrun, self.unheld)
        )
        return overrun, unheld

    def booked(self, decision: Decision, booked: bool) -> None:
        """The quantum was booked (`booked`: it charged anyone): overrun and unheld are
        settled (users gone meanwhile owe nothing), and what it charged may be given back."""
        self.overrun.clear()
        self.unheld.clear()
        self.charged_jobs = decision.entitled if booked else frozenset()
        self._charged = decision.charged if booked else {}
        self.refundable = {}

    def _refundable(self, user: str) -> dict[str, float]:
        """Pool -> what of the last booked quantum's charge to `user` may still be given back
        (worked out when first asked: most users start nothing late)."""
        left = self.refundable.get(user)
        if left is None:
            charged = self._charged.get(user, {})
            left = self.refundable[user] = {
                pool: gpus * self.quantum_s for pool, gpus in charged.items()
            }
        return left
