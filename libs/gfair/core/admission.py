"""Admission: whether a submitted job may run now, waits, or never will; one pure machine that
placement and the simulator both drive (`Admitter.apply`: an input in, decisions out; no I/O,
no clock).

**Dependencies** (Slurm's ``--dependency=afterok``). A job may name jobs of the same user
(`after_ok`) that must each complete successfully before it may run. `eligibility` decides, from
what is known of each one's outcome:

- **ready** when every one of them completed (a dependency that completed before the job was
  submitted is satisfied at once);
- **doomed** when one of them failed, was cancelled or was rejected: it can never complete, so
  the job is refused at submission, or cancelled once held, with that one named in the reason
  (Slurm's ``kill_invalid_depend``). Cancelling it is itself an outcome, so a chain of
  dependents is cancelled link by link;
- **unknown** when one of them is no job of the user's (refused at submission);
- **held** otherwise: it waits for those still running or queued.

A held job is not runnable: the drivers keep it out of the scheduler altogether (placement
admits it as `held` and announces it as accepted only when released; the simulator submits it
to its policy only then), so it counts toward no demand and keeps no GPU idle.

**Array holds.** A driver whose scheduler does not limit arrays itself (the simulator's
baselines; gandiva-fair's machine does, `gfair.core.arrays`) names the array in `Arrived`:
then at most `array_limit` of its members are admitted at once, the others held in arrival
order until a member ends.

Refusals a driver finds by itself (the operator's limits, no pool that fits: `filters`) come in
with the submission, so that the machine knows the job as rejected; a driver that refuses an
admitted job after all (the simulator's policy) says so with `Finished(..., REJECTED)`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias


class DependencyOutcome(StrEnum):
    """What is known of a job another one depends on."""

    PENDING = "pending"  # not ended yet
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


class Readiness(StrEnum):
    READY = "ready"
    HELD = "held"
    DOOMED = "doomed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Eligibility:
    readiness: Readiness
    waiting_on: tuple[str, ...] = ()  # HELD: the dependencies not ended yet, in the job's order
    blocker: str | None = None  # DOOMED or UNKNOWN: the first dependency that decided it
    blocker_outcome: DependencyOutcome | None = None  # DOOMED: how that one ended

    @property
    def reason(self) -> str:
        """One line for the job's record and `gfair why`."""
        match self.readiness:
            case Readiness.READY:
                return "every job it depends on completed"
            case Readiness.HELD:
                return f"waiting for {', '.join(self.waiting_on)} to complete (after_ok)"
            case Readiness.DOOMED:
                return f"dependency {self.blocker} {self.blocker_outcome}: it can never complete"
            case _:
                return f"dependency {self.blocker} is no job of this user"


def eligibility(after_ok: Iterable[str], outcomes: Mapping[str, DependencyOutcome]) -> Eligibility:
    """Whether a job that depends on `after_ok` may run, from the known `outcomes` (module doc).

    `outcomes` maps the user's job ids to what is known of them; a job id absent from it is
    unknown. A failed dependency decides before an unknown one, and both before waiting.
    """
    deps = tuple(after_ok)
    failed = next(
        (
            d
            for d in deps
            if outcomes.get(d) not in (None, DependencyOutcome.PENDING, DependencyOutcome.COMPLETED)
        ),
        None,
    )
    if failed is not None:
        return Eligibility(Readiness.DOOMED, blocker=failed, blocker_outcome=outcomes[failed])
    unknown = next((d for d in deps if d not in outcomes), None)
    if unknown is not None:
        return Eligibility(Readiness.UNKNOWN, blocker=unknown)
    waiting = tuple(d for d in deps if outcomes[d] is DependencyOutcome.PENDING)
    if waiting:
        return Eligibility(Readiness.HELD, waiting_on=waiting)
    return Eligibility(Readiness.READY)


# The machine ----------------------------------------------------------------------------------

UNKNOWN_DEPENDENCY = "unknown_dependency"  # the rejection codes of the event contract's
DEPENDENCY_FAILED = "dependency_failed"


@dataclass(frozen=True, slots=True)
class Arrived:
    """A job submitted; `refusal` (code, reason) when the driver's own checks refused it."""

    user: str
    job_id: str
    after_ok: tuple[str, ...] = ()
    array: str | None = None  # held to `array_limit` members at once (module doc)
    array_limit: int | None = None
    refusal: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """A job admitted earlier ended (or was refused after all: `REJECTED`)."""

    user: str
    job_id: str
    outcome: DependencyOutcome


@dataclass(frozen=True, slots=True)
class Known:
    """What a driver's store says of a job (placement's records, read at start or again after a
    write that failed): held (`outcome` None) or its outcome. Decides nothing."""

    user: str
    job_id: str
    after_ok: tuple[str, ...] = ()
    outcome: DependencyOutcome | None = DependencyOutcome.PENDING


@dataclass(frozen=True, slots=True)
class Purged:
    """Jobs whose records are gone (retention): naming one is naming no job."""

    jobs: tuple[tuple[str, str], ...]


Input: TypeAlias = Arrived | Finished | Known | Purged


@dataclass(frozen=True, slots=True)
class Admit:
    """The job may run: at submission (`released` empty) or once held (why it was released)."""

    user: str
    job_id: str
    released: str = ""


@dataclass(frozen=True, slots=True)
class Hold:
    user: str
    job_id: str
    reason: str
    waiting_on: tuple[str, ...] = ()  # the dependencies not ended yet


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refused at submission, with a rejection code of the event contract."""

    user: str
    job_id: str
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """A held job that can never run: a dependency will not complete."""

    user: str
    job_id: str
    reason: str


Decision: TypeAlias = Admit | Hold | Refuse | Cancel
_Key: TypeAlias = tuple[str, str]  # (user, job id): dependencies are within one user's jobs


class Admitter:
    """The admission machine (module doc). `apply` takes one input and returns its decisions,
    those it causes down dependency chains and array queues included, in order."""

    def __init__(self) -> None:
        self._known: dict[_Key, DependencyOutcome] = {}
        self._after_ok: dict[_Key, tuple[str, ...]] = {}  # jobs held for dependencies
        # Job -> the jobs naming it in `after_ok`, in submission order (a dict as ordered set).
        self._dependents: dict[_Key, dict[_Key, None]] = {}
        self._gated: dict[_Key, Arrived] = {}  # held array members, for their release
        self._arrays: dict[_Key, tuple[str, str]] = {}  # members admitted: their (user, array)
        self._admitted: Counter[tuple[str, str]] = Counter()  # (user, array) -> members
        self._waiting: dict[tuple[str, str], deque[Arrived]] = {}
        self._queued: dict[_Key, str] = {}  # members waiting for a slot -> their array

    def apply(self, given: Input) -> list[Decision]:
        out: list[Decision] = []
        match given:
            case Arrived():
                self._submit(given, out)
            case Finished():
                self._end((given.user, given.job_id), given.outcome, out)
            case Known():
                self._note(given)
            case Purged():
                self._forget(given.jobs)
        return out

    def held(self, user: str, job_id: str) -> str | None:
        """Why the job is held (None: it is not)."""
        key = (user, job_id)
        if key in self._after_ok:
            return eligibility(
                self._after_ok[key], self._outcomes(user, self._after_ok[key])
            ).reason
        array = self._queued.get(key)
        return None if array is None else f"waiting for a slot of array {array}"

    def dependents(self, user: str, job_id: str) -> tuple[str, ...]:
        """The ids of the user's jobs that named this one in `after_ok`, in submission order."""
        return tuple(job for _, job in self._dependents.get((user, job_id), ()))

    def _outcomes(self, user: str, job_ids: Iterable[str]) -> dict[str, DependencyOutcome]:
        known = self._known
        return {j: known[(user, j)] for j in job_ids if (user, j) in known}

    def _submit(self, job: Arrived, out: list[Decision]) -> None:
        key = (job.user, job.job_id)
        if job.refusal is not None:
            self._known[key] = DependencyOutcome.REJECTED
            out.append(Refuse(job.user, job.job_id, *job.refusal))
            return
        if job.after_ok:
            verdict = eligibility(job.after_ok, self._outcomes(job.user, job.after_ok))
            if verdict.readiness is Readiness.UNKNOWN or verdict.readiness is Readiness.DOOMED:
                self._known[key] = DependencyOutcome.REJECTED
                out.append(Refuse(job.user, job.job_id, *_refusal(job.user, verdict)))
                return
            self._note(Known(job.user, job.job_id, job.after_ok, None))
            if verdict.readiness is Readiness.HELD:
                out.append(Hold(job.user, job.job_id, verdict.reason, verdict.waiting_on))
                if job.array is not None:  # its array's limit applies once it is released
                    self._gated[key] = job
                return
            self._after_ok.pop(key)
        self._known[key] = DependencyOutcome.PENDING
        self._gate(job, "", out)

    def _gate(self, job: Arrived, released: str, out: list[Decision]) -> None:
        """Admit `job`, or queue it behind its array's limit."""
        key = (job.user, job.job_id)
        if job.array is not None and job.array_limit is not None:
            array = (job.user, job.array)
            if self._admitted[array] >= job.array_limit:
                self._waiting.setdefault(array, deque()).append(job)
                self._queued[key] = job.array
                reason = f"waiting for a slot of array {job.array}"
                out.append(Hold(job.user, job.job_id, reason))
                return
            self._admitted[array] += 1
            self._arrays[key] = array
        out.append(Admit(job.user, job.job_id, released))

    def _end(self, key: _Key, outcome: DependencyOutcome, out: list[Decision]) -> None:
        """`key` is over: the jobs held for it follow, then its array's next member."""
        self._known[key] = outcome
        user = key[0]
        for waiting in list(self._dependents.get(key, ())):
            after_ok = self._after_ok.get(waiting)
            if after_ok is None:
                continue
            verdict = eligibility(after_ok, self._outcomes(user, after_ok))
            if verdict.readiness is Readiness.HELD:
                continue
            del self._after_ok[waiting]
            if verdict.readiness is Readiness.READY:
                self._known[waiting] = DependencyOutcome.PENDING
                job = self._gated.pop(waiting, None) or Arrived(*waiting)
                self._gate(job, verdict.reason, out)
            else:
                self._gated.pop(waiting, None)
                out.append(Cancel(*waiting, verdict.reason))
                self._end(waiting, DependencyOutcome.CANCELLED, out)
        array = self._arrays.pop(key, None)
        if array is not None:
            self._admitted[array] -= 1
            queue = self._waiting.get(array)
            if queue:
                job = queue.popleft()
                del self._queued[(job.user, job.job_id)]
                self._gate(job, f"a slot of array {job.array} is free", out)

    def _note(self, job: Known) -> None:
        key = (job.user, job.job_id)
        if job.outcome is None:
            self._after_ok[key] = job.after_ok
            self._known[key] = DependencyOutcome.PENDING
        else:
            self._after_ok.pop(key, None)
            self._known[key] = job.outcome
        for dependency in job.after_ok:
            self._dependents.setdefault((job.user, dependency), {})[key] = None

    def _forget(self, jobs: Iterable[_Key]) -> None:
        gone = set(jobs)
        for key in gone:
            self._known.pop(key, None)
            self._after_ok.pop(key, None)
            self._dependents.pop(key, None)
        for dependents in self._dependents.values():
            for key in gone.intersection(dependents):
                del dependents[key]


def _refusal(user: str, verdict: Eligibility) -> tuple[str, str]:
    if verdict.readiness is Readiness.UNKNOWN:
        return (
            UNKNOWN_DEPENDENCY,
            f"after_ok: {user} has no job {verdict.blocker} (a job may depend only on its own "
            "user's jobs)",
        )
    return DEPENDENCY_FAILED, f"after_ok: {verdict.reason}"
