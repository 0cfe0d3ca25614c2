"""Ships what jobs write to stdout and stderr into JetStream (`gfair.bus.job_output`).

Every `interval_s` it reads what the runs it follows appended to ``stdout.log`` and
``stderr.log`` since the last pass and publishes it in chunks. It follows the newest run
directory of every job started here (a job that started and ended between two passes too),
and keeps following a run after its process is gone until a pass finds nothing new: then the
run's files are complete, and an end chunk closes each. What was shipped is remembered
beside the runs (``<records>/<user>/<job>/<run>.json``, written after the store acknowledged;
not in the run directory, which belongs to the job), so an executor that restarts goes on
where it stopped and ships the rest of the runs it left unfinished; a repeat of a chunk is
dropped by its message id.

Once a job has not run here for `retention_s` and the end of every run of it was told and
shipped, its runs' directories go, with its default working directory (`sweep`, at most once
an hour).

What a run keeps of each output is capped (`max_bytes`): past it the shipper cuts the file
back to the cap and a note saying so (`cap_output`; the supervisor does so too, every half
second, while the job runs), which is shipped as its end, and logs it once. A pass ships at
most `pass_bytes` of a run, so a flood's backlog goes out over several passes between which
the executor does its other work.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import structlog

from gfair.bus.job_output import (
    MAX_CHUNK_BYTES,
    OUTPUTS,
    OutputChunk,
    publish_chunk,
)
from gfair.bus.transport import Bus
from gfair.events.fields import JobRef
from gfair.node.job_disk import OUTPUT_MAX_BYTES, cap_output, capped_note
from gfair.node.job_files import NotOwnFile, open_own
from gfair.node.run_directory import TOLD_RECORD

_log = structlog.get_logger("gfair.services.node_executor")

_SWEEP_EVERY_S = 3600.0


class Run(Protocol):
    """What the shipper needs of a run in the executor's table (`LocalJob` is one)."""

    @property
    def job(self) -> JobRef: ...

    @property
    def running(self) -> bool: ...

    @property
    def start_event_id(self) -> str: ...


class OutputShipper:
    def __init__(
        self,
        bus: Bus,
        node_id: str,
        runs_root: Path,
        records_root: Path,
        runs: Callable[[], Iterable[Run]],
        *,
        interval_s: float = 1.0,
        chunk_bytes: int = MAX_CHUNK_BYTES,
        max_bytes: int = OUTPUT_MAX_BYTES,
        pass_bytes: int = 64 * MAX_CHUNK_BYTES,
        retention_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._bus = bus
        self._node_id = node_id
        self._runs_root = runs_root
        self._records = records_root
        self._runs = runs
        self._interval_s = interval_s
        self._chunk_bytes = chunk_bytes
        self._max_bytes = max_bytes
        self._pass_bytes = pass_bytes
        self._retention_s = retention_s
        self._clock = clock
        self._swept_at = -math.inf
        # (run, output) found over its cap: said once.
        self._capped: set[tuple[Path, str]] = set()
        # Run directory -> (user, job id) for every run followed.
        self._followed: dict[Path, JobRef] = {}
        self._offsets: dict[Path, dict[str, int]] = {}
        # The start each job's newest followed run came from, and the runs closed.
        self._starts: dict[JobRef, str] = {}
        self._closed: set[Path] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Follow the runs left unfinished by an earlier executor, then ship every interval."""
        for run in self._runs_root.glob("*/*/run-*"):
            if not _read_record(self._record_path(run)).get("ended"):
                self._followed[run] = JobRef(user=run.parent.parent.name, job_id=run.parent.name)
        self._task = asyncio.create_task(self._loop(), name="output-shipper")

    async def stop(self) -> None:
        """Stop the loop, then one last pass (after a drain: the suspended runs' last words)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            await self.ship()
        except Exception as exc:
            _log.warning("shipping job output failed", error=repr(exc))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.ship()
            except Exception as exc:
                # NATS away for a moment: the bytes stay in the files for the next pass.
                _log.warning("shipping job output failed", error=repr(exc))

    async def ship(self) -> int:
        """One pass over the runs followed; the bytes shipped."""
        started = list(self._runs())
        now = self._clock()
        if self._retention_s is not None and now - self._swept_at >= _SWEEP_EVERY_S:
            self._swept_at = now
            live = {s.job for s in started if s.running} | set(self._followed.values())
            await asyncio.to_thread(self.sweep, now - self._retention_s, live)
        running = {s.job for s in started if s.running}
        for start in started:
            if not start.running and self._starts.get(start.job) == start.start_event_id:
                continue  # over, and its run directory found already
            latest = _latest_run(self._runs_root / start.job.user / start.job.job_id)
            if latest is None:
                continue  # not launched yet
            self._starts[start.job] = start.start_event_id
            if latest in self._followed or latest in self._closed:
                continue
            if not _read_record(self._record_path(latest)).get("ended"):
                self._followed[latest] = start.job
        shipped = 0
        for run, job in list(self._followed.items()):
            sent = await self._ship_run(run, job)
            shipped += sent
            if sent == 0 and (job not in running or _latest_run(run.parent) != run):
                # Its process is gone and a pass found nothing new: its files are complete.
                await self._close_run(run, job)
        return shipped

    async def _ship_run(self, run: Path, job: JobRef) -> int:
        offsets = self._offsets.get(run)
        if offsets is None:
            offsets = self._offsets[run] = _offsets(_read_record(self._record_path(run)))
        sent = 0
        for output in OUTPUTS:
            path = run / f"{output}.log"
            note = capped_note(output, self._max_bytes)
            cut = await asyncio.to_thread(cap_output, path, output, self._max_bytes)
            if cut and (run, output) not in self._capped:
                self._capped.add((run, output))
                _log.warning(
                    "a job's output went over its cap: the rest is not kept",
                    user=job.user,
                    job_id=job.job_id,
                    run=run.name,
                    output=output,
                    max_bytes=self._max_bytes,
                )
            end = self._max_bytes + len(note)
            budget = self._pass_bytes
            while True:
                offset = offsets.get(output, 0)
                size = min(self._chunk_bytes, end - offset, budget)
                data = await asyncio.to_thread(_read_at, path, offset, size) if size > 0 else b""
                if not data:
                    break
                budget -= len(data)
                chunk = OutputChunk(output, self._node_id, run.name, offset, data)
                await publish_chunk(self._bus, job.user, job.job_id, chunk)
                offsets[output] = offset + len(data)
                sent += len(data)
        if sent:
            _write_record(self._record_path(run), {"offsets": offsets, "ended": False})
        return sent

    async def _close_run(self, run: Path, job: JobRef) -> None:
        offsets = self._offsets.pop(run, {})
        for output in OUTPUTS:
            end = OutputChunk(output, self._node_id, run.name, offsets.get(output, 0), b"", True)
            await publish_chunk(self._bus, job.user, job.job_id, end)
        _write_record(self._record_path(run), {"offsets": offsets, "ended": True})
        del self._followed[run]
        self._closed.add(run)

    def sweep(self, before: float, live: set[JobRef]) -> list[JobRef]:
        """Remove what jobs not in `live` left here, once every run of theirs was told (its
        end reported) and shipped, the last before `before`; the jobs whose went."""
        removed: list[JobRef] = []
        for job_dir in self._runs_root.glob("*/*"):
            job = JobRef(user=job_dir.parent.name, job_id=job_dir.name)
            if job in live or not job_dir.is_dir():
                continue
            runs = list(job_dir.glob("run-*"))
            records = [self._record_path(run) for run in runs]
            told = [run / TOLD_RECORD for run in runs]
            try:
                # Without runs (its starts were refused), the directory's own age counts.
                ages = [t.stat(follow_symlinks=False).st_mtime for t in told] or [
                    job_dir.stat(follow_symlinks=False).st_mtime
                ]
                done = all(_read_record(r).get("ended") for r in records) and max(ages) < before
            except FileNotFoundError:
                continue  # a run whose end was never told: kept for the executor to report
            if not done:
                continue
            # The directories are root's, a job's own inside them: removed without following
            # a link (rmtree works through descriptors here).
            shutil.rmtree(job_dir, ignore_errors=True)
            for record in records:
                record.unlink(missing_ok=True)
            removed.append(job)
            self._closed.difference_update(runs)
        if removed:
            _log.info("run directories past their retention removed", jobs=len(removed))
        return removed

    def _record_path(self, run: Path) -> Path:
        return self._records / run.parent.parent.name / run.parent.name / f"{run.name}.json"


def _latest_run(job_dir: Path) -> Path | None:
    runs = [p for p in job_dir.glob("run-*") if p.name.removeprefix("run-").isdigit()]
    return max(runs, key=lambda p: int(p.name.removeprefix("run-")), default=None)


def _read_at(path: Path, offset: int, size: int) -> bytes:
    try:
        # Never through a link: what is read goes to the job's tenant.
        with open_own(path, None) as stream:
            stream.seek(offset)
            return stream.read(size)
    except (FileNotFoundError, NotOwnFile):
        return b""


def _read_record(path: Path) -> dict[str, object]:
    try:
        found = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _offsets(record: dict[str, object]) -> dict[str, int]:
    raw = record.get("offsets")
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if k in OUTPUTS and isinstance(v, int) and v >= 0}


def _write_record(path: Path, record: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(record))
    os.replace(partial, path)
