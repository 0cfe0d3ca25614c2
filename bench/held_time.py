"""Where a job's GPU-seconds held went, hold by hold: switching, or slower mini-batches.

A hold runs from a start or resume command at the node (`JobStarted`'s report; a resume's report
less its `duration_s`) to the report that freed its GPUs (`JobSuspended`, `JobExited`), the
span `gfair.client.switching.seconds_held` sums. The job's own records (its progress files,
timed by its clock, which on one machine is the node's) split each hold into:

- to first step: the command to the end of the first mini-batch of the hold (a resume in place,
  a process's start and imports, or the first batch of a prepared start's first slice); an
  in-place resume's report comes after that mini-batch, a little late, so the hold as
  `seconds_held` counts it begins after the command: `late_report_s` sums what that leaves out;
- stepping: the first to the last mini-batch of the hold, against as many of the job's
  mini-batches alone (`alone_step_s`): the difference is how much slower its steps ran;
- to parked: the last mini-batch to the job's `parked` (or `yield`, `complete`) record: moving
  its state off the GPU, or a checkpoint;
- to report: that record to the node's report of the GPUs free (its exit, when it exited).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gfair.bus.history import HistoricalEvent
from gfair.events.jobs import JobExited, JobResumed, JobStarted, JobSuspended
from gfair.sdk.environment import PROGRESS_FILE

# The job's records that end a hold, before the node reports it.
_ENDINGS = frozenset({"parked", "yield", "complete"})


@dataclass(frozen=True, slots=True)
class Hold:
    began: float
    ended: float
    steps: int
    first_step: float | None
    last_step: float | None
    # The job's record that it let go (parked, yield, complete) after its last mini-batch.
    let_go: float | None
    # The job's `resumed` record after an in-place resume's command.
    resumed: float | None
    # The resume's `duration_s`: its command to the first mini-batch after it.
    resume_s: float | None = None

    @property
    def held_s(self) -> float:
        return self.ended - self.began


@dataclass(frozen=True, slots=True)
class HeldTime:
    """Sums over a job's holds (seconds) and the medians per hold of the switches' parts."""

    holds: int
    held_s: float
    to_first_step_s: float
    stepping_s: float
    # The same mini-batches' time alone (each hold's steps after its first).
    alone_s: float
    to_parked_s: float
    to_report_s: float
    # Hold time before the resumes' `began`: their command (the first mini-batch less the
    # resume's duration, by the job's clock) to their report less that duration, i.e. what
    # `seconds_held` leaves out because the report came late.
    late_report_s: float
    command_to_resumed_p50: float | None
    to_first_step_p50: float | None
    to_parked_p50: float | None
    to_report_p50: float | None

    @property
    def step_ratio(self) -> float:
        """How much longer its mini-batches took held than alone."""
        return self.stepping_s / self.alone_s if self.alone_s > 0 else 0.0


def step_records(data_dir: Path, user: str, job_id: str) -> list[dict[str, object]]:
    """Every record of the job's runs on every node, by time."""
    found: list[dict[str, object]] = []
    for progress in data_dir.glob(f"nodes/*/runs/{user}/{job_id}/run-*/control/{PROGRESS_FILE}"):
        found.extend(json.loads(line) for line in progress.read_text(encoding="utf-8").splitlines())
    return sorted(found, key=lambda record: float(str(record["time"])))


def holds(events: Iterable[HistoricalEvent], records: Sequence[dict[str, object]]) -> list[Hold]:
    spans: list[tuple[float, float, float | None]] = []
    since: float | None = None
    resume_s: float | None = None
    for event in events:
        at = event.envelope.time.timestamp()
        if isinstance(event.data, JobStarted | JobResumed):
            resume_s = None
            if isinstance(event.data, JobResumed) and event.data.duration_s is not None:
                resume_s = event.data.duration_s
                at -= resume_s
            since = at
        elif isinstance(event.data, JobSuspended | JobExited) and since is not None:
            spans.append((since, at, resume_s))
            since = None
    found = []
    previous_end = float("-inf")
    for began, ended, resume_s in spans:
        # An in-place resume is reported after its first mini-batch: its `resumed` record, and
        # that mini-batch, may precede `began` (the report less the resume's duration) by as
        # much as the report was late.
        resumed = next(
            (
                _time(r)
                for r in reversed(records)
                if r["kind"] == "resumed" and previous_end < _time(r) <= ended
            ),
            None,
        )
        opened = began if resumed is None else min(began, resumed)
        previous_end = ended
        inside = [r for r in records if opened <= _time(r) <= ended]
        steps = [r for r in inside if r["kind"] == "step"]
        last = _time(steps[-1]) if steps else None
        let_go = next(
            (
                _time(r)
                for r in inside
                if r["kind"] in _ENDINGS and (last is None or _time(r) >= last)
            ),
            None,
        )
        found.append(
            Hold(
                began=began,
                ended=ended,
                # Records are sampled (gfair.sdk.progress): count by their step numbers.
                steps=int(str(steps[-1]["step"])) - int(str(steps[0]["step"])) + 1 if steps else 0,
                first_step=_time(steps[0]) if steps else None,
                last_step=last,
                let_go=let_go,
                resumed=resumed,
                resume_s=resume_s,
            )
        )
    return found


def _time(record: dict[str, object]) -> float:
    return float(str(record["time"]))


def held_time(found: Sequence[Hold], alone_step_s: float) -> HeldTime:
    stepped = [h for h in found if h.first_step is not None and h.last_step is not None]
    to_first = [max(0.0, h.first_step - h.began) for h in stepped if h.first_step is not None]
    to_parked = [
        h.let_go - h.last_step for h in stepped if h.let_go is not None and h.last_step is not None
    ]
    to_report = [h.ended - h.let_go for h in found if h.let_go is not None]
    # Command to `resumed`: the resume's duration less its `resumed` record to its first step.
    to_resumed = [
        h.resume_s - (h.first_step - h.resumed)
        for h in found
        if h.resumed is not None and h.resume_s is not None and h.first_step is not None
    ]
    return HeldTime(
        holds=len(found),
        held_s=sum(h.held_s for h in found),
        to_first_step_s=sum(to_first),
        stepping_s=sum(
            h.last_step - h.first_step
            for h in stepped
            if h.last_step is not None and h.first_step is not None
        ),
        alone_s=sum(max(0, h.steps - 1) for h in stepped) * alone_step_s,
        to_parked_s=sum(to_parked),
        to_report_s=sum(to_report),
        late_report_s=sum(
            max(0.0, h.began - (h.first_step - h.resume_s))
            for h in found
            if h.first_step is not None and h.resume_s is not None
        ),
        command_to_resumed_p50=_median(to_resumed),
        to_first_step_p50=_median(to_first),
        to_parked_p50=_median(to_parked),
        to_report_p50=_median(to_report),
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
