"""Job traces: gfair's own CSV and the Philly CSV, read into one in-memory form.

The format is told apart by the header, compression by the file suffix (`.xz`, `.gz`). Every
malformed row is reported with its physical line number and the offending column, and nothing is
returned: a simulation over a half-read trace would measure the wrong workload.

gfair CSV: ``submit_time_s,user,gpus,duration_s[,job_type][,tickets][,job_id][,array]
[,array_limit][,after_ok][,move_s][,resume_s][,time_limit_s][,image]`` (any column order).
``duration_s`` is the job's run time on a V100; ``job_type`` names a row of the Gavel table or
is empty; ``tickets`` is per user and may be left empty on all but one of its rows. As `gfair
submit` has them: ``array`` names the user's job array the job belongs to and ``array_limit``
how many of it may run at once (the same on every row of the array that gives one); ``after_ok``
lists, space-separated, the job ids of the same user that must complete first (a job id the
trace does not have is an error). ``move_s`` and ``resume_s`` are the job's own switching costs
(`gfair.core.switch_costs`), seconds of progress lost starting on other servers and resuming on
its own; empty: the run's. ``time_limit_s`` is `gfair submit --time-limit`'s, in seconds: the
gandiva-fair policy ends the job (failed) once it ran that long on GPUs; empty: none. ``image``
is the container image the job runs in (`gfair submit --image`), carried with the job; it
changes no scheduling decision.

Philly CSV: ``timestamp,duration,num_gpus,gpu_time,cluster[,job_id]``. The virtual cluster
(``cluster``) is the tenant; timestamps become seconds since the earliest submission (the file is
not sorted). ``gpu_time`` is redundant with ``duration * num_gpus`` and is only checked to be a
number. Philly jobs carry no job type.
"""

from __future__ import annotations

import csv
import gzip
import lzma
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from gfair.core.scheduler import Launch
from gfair.core.switch_costs import SwitchCosts

if TYPE_CHECKING:
    from _csv import Reader as CsvReader

# User names and job ids double as NATS subject tokens elsewhere in gfair (CONTRIBUTING).
_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")

GFAIR_REQUIRED: Final = ("submit_time_s", "user", "gpus", "duration_s")
GFAIR_OPTIONAL: Final = (
    "job_type",
    "tickets",
    "job_id",
    "array",
    "array_limit",
    "after_ok",
    "move_s",
    "resume_s",
    "image",
    "time_limit_s",
)
PHILLY_REQUIRED: Final = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
PHILLY_OPTIONAL: Final = ("job_id",)


class TraceError(ValueError):
    """A trace cannot be read; the message names the file, line and column."""

    def __init__(self, source: str, message: str, line: int | None = None) -> None:
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line = line


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace. `duration_s` is its run time on a V100 (the work to do)."""

    id: str
    user: str
    gpus: int
    submit_s: float
    duration_s: float
    job_type: str | None = None
    line: int = 0  # physical line in the source file, for later error messages
    after_ok: tuple[str, ...] = ()  # jobs that must complete first (gfair.core.dependencies)
    array: str | None = None  # its job array's id (the user's), if any
    array_limit: int | None = None  # at most this many of its array run at once
    move_s: float | None = None  # its own switching costs; None: the run's
    resume_s: float | None = None
    image: str | None = None  # the container image it runs in; None: a process
    time_limit_s: float | None = None  # running time after which the scheduler ends it

    def launch(self) -> Launch | None:
        """What the scheduler's core reads of how its user asked it to run (its limits), as the
        live service hands it over (`Admitted.launch`); None: nothing asked."""
        if self.time_limit_s is None:
            return None
        return Launch((), {}, time_limit=self.time_limit_s)

    def costs(self, default: SwitchCosts) -> SwitchCosts:
        """Its switching costs: its own where it has them, else `default`'s."""
        if self.move_s is None and self.resume_s is None:
            return default
        return SwitchCosts(
            resume_s=default.resume_s if self.resume_s is None else self.resume_s,
            migration_s=default.migration_s if self.move_s is None else self.move_s,
        )


@dataclass(frozen=True)
class Trace:
    """Jobs sorted by submission time (ties keep file order) and per-user tickets given."""

    jobs: tuple[TraceJob, ...]
    tickets: Mapping[str, float]
    source: str
    format: str  # "gfair" or "philly"

    @property
    def users(self) -> tuple[str, ...]:
        """Users in order of first submission."""
        return tuple(dict.fromkeys(job.user for job in self.jobs))

    def head(self, count: int) -> Trace:
        """The first `count` jobs by submission time (a sampled prefix for quick replays)."""
        jobs = self.jobs[:count]
        users = {job.user for job in jobs}
        tickets = {user: n for user, n in self.tickets.items() if user in users}
        return Trace(jobs=jobs, tickets=tickets, source=self.source, format=self.format)


def read_trace(path: str | Path) -> Trace:
    """Read a gfair or Philly CSV trace, plain or compressed (`.xz`, `.gz`)."""
    path = Path(path)
    try:
        with _open_text(path) as stream:
            return parse_trace(stream, source=str(path))
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as error:
        raise TraceError(str(path), f"cannot read: {error}") from error


def parse_trace(stream: Iterable[str], source: str = "<trace>") -> Trace:
    """Parse CSV text; `source` names it in error messages."""
    reader = csv.reader(stream)
    try:
        header = next(reader)
    except StopIteration:
        raise TraceError(source, "empty file: no header", line=1) from None
    except csv.Error as error:
        raise TraceError(source, f"bad CSV: {error}", line=reader.line_num) from error
    columns = [name.strip() for name in header]
    names = set(columns)
    if len(names) != len(columns):
        raise TraceError(source, f"duplicate column in header {columns}", line=1)
    if names.issuperset(GFAIR_REQUIRED):
        _check_known(columns, GFAIR_REQUIRED + GFAIR_OPTIONAL, source)
        return _GfairRows(source, columns).read(reader)
    if names.issuperset(PHILLY_REQUIRED):
        _check_known(columns, PHILLY_REQUIRED + PHILLY_OPTIONAL, source)
        return _PhillyRows(source, columns).read(reader)
    raise TraceError(
        source,
        "unrecognised header "
        f"{columns}: expected gfair ({','.join(GFAIR_REQUIRED + GFAIR_OPTIONAL[:2])}) "
        f"or Philly ({','.join(PHILLY_REQUIRED)}) columns",
        line=1,
    )


def _open_text(path: Path) -> IO[str]:
    suffix = path.suffix.lower()
    if suffix == ".xz":
        return lzma.open(path, "rt", encoding="utf-8", newline="")
    if suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def _check_known(columns: list[str], allowed: tuple[str, ...], source: str) -> None:
    unknown = [name for name in columns if name not in allowed]
    if unknown:
        raise TraceError(source, f"unknown column(s) {unknown}; allowed: {list(allowed)}", line=1)


class _Rows:
    """Shared row walking: field lookup by column name, typed field parsers with locations."""

    def __init__(self, source: str, columns: list[str]) -> None:
        self.source = source
        self.index = {name: i for i, name in enumerate(columns)}
        self.width = len(columns)
        self.line = 0

    def rows(self, reader: CsvReader) -> Iterator[tuple[int, list[str]]]:
        """Data rows with their physical line numbers; blank lines are skipped."""
        data_row = 0
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                raise TraceError(self.source, f"bad CSV: {error}", reader.line_num) from error
            line_num = reader.line_num
            if not row or all(not field.strip() for field in row):
                continue
            self.line = line_num
            if len(row) != self.width:
                raise self.error(f"expected {self.width} fields, got {len(row)}")
            yield data_row, row
            data_row += 1

    def error(self, message: str, column: str | None = None) -> TraceError:
        where = f"column '{column}': " if column else ""
        return TraceError(self.source, where + message, line=self.line)

    def text(self, row: list[str], column: str) -> str:
        return row[self.index[column]].strip()

    def optional(self, row: list[str], column: str) -> str:
        position = self.index.get(column)
        return "" if position is None else row[position].strip()

    def token(self, row: list[str], column: str) -> str:
        value = self.text(row, column)
        if not _TOKEN.fullmatch(value):
            raise self.error(f"expected 1-64 of [A-Za-z0-9_-], got {value!r}", column)
        return value

    def number(self, row: list[str], column: str, *, positive: bool) -> float:
        return self.parse_number(self.text(row, column), column, positive=positive)

    def parse_number(self, raw: str, column: str, *, positive: bool) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise self.error(f"expected a number, got {raw!r}", column) from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "> 0" if positive else ">= 0"
            raise self.error(f"expected a finite number {bound}, got {raw!r}", column)
        return value

    def count(self, row: list[str], column: str) -> int:
        raw = self.text(row, column)
        try:
            value = int(raw)
        except ValueError:
            # Accept "4.0": some exporters write every number as a float.
            try:
                as_float = float(raw)
            except ValueError:
                as_float = math.nan
            if not as_float.is_integer():
                raise self.error(f"expected a positive integer, got {raw!r}", column) from None
            value = int(as_float)
        if value < 1:
            raise self.error(f"expected a positive integer, got {raw!r}", column)
        return value

    def job_id(self, row: list[str], data_row: int, seen: set[str]) -> str:
        if "job_id" not in self.index:
            return str(data_row)
        job_id = self.token(row, "job_id")
        if job_id in seen:
            raise self.error(f"duplicate job id {job_id!r}", "job_id")
        seen.add(job_id)
        return job_id


class _GfairRows(_Rows):
    def read(self, reader: CsvReader) -> Trace:
        jobs: list[TraceJob] = []
        tickets: dict[str, float] = {}
        limits: dict[tuple[str, str], int] = {}
        seen: set[str] = set()
        for data_row, row in self.rows(reader):
            user = self.token(row, "user")
            raw_tickets = self.optional(row, "tickets")
            if raw_tickets:
                value = self.parse_number(raw_tickets, "tickets", positive=True)
                if tickets.setdefault(user, value) != value:
                    raise self.error(
                        f"user {user!r} has {value:g} tickets here but {tickets[user]:g} earlier",
                        "tickets",
                    )
            array, limit = self.array(row, user, limits)
            jobs.append(
                TraceJob(
                    id=self.job_id(row, data_row, seen),
                    user=user,
                    gpus=self.count(row, "gpus"),
                    submit_s=self.number(row, "submit_time_s", positive=False),
                    duration_s=self.number(row, "duration_s", positive=True),
                    job_type=self.optional(row, "job_type") or None,
                    line=self.line,
                    after_ok=self.after_ok(row),
                    array=array,
                    array_limit=limit,
                    move_s=self.seconds(row, "move_s"),
                    resume_s=self.seconds(row, "resume_s"),
                    image=self.optional(row, "image") or None,
                    time_limit_s=self.time_limit(row),
                )
            )
        self.check_dependencies(jobs)
        jobs = [
            replace(job, array_limit=limits.get((job.user, job.array))) if job.array else job
            for job in jobs
        ]
        return _finish(jobs, tickets, self.source, "gfair")

    def array(
        self, row: list[str], user: str, limits: dict[tuple[str, str], int]
    ) -> tuple[str | None, int | None]:
        name = self.optional(row, "array")
        raw_limit = self.optional(row, "array_limit")
        if not name:
            if raw_limit:
                raise self.error("array_limit needs an array", "array_limit")
            return None, None
        if not _TOKEN.fullmatch(name):
            raise self.error(f"expected 1-64 of [A-Za-z0-9_-], got {name!r}", "array")
        if not raw_limit:
            return name, None  # the array's limit, if a row gives one, is filled in after
        limit = self.count(row, "array_limit")
        if limits.setdefault((user, name), limit) != limit:
            raise self.error(
                f"array {name!r} of {user!r} runs {limit} at once here but "
                f"{limits[(user, name)]} earlier",
                "array_limit",
            )
        return name, limit

    def seconds(self, row: list[str], column: str) -> float | None:
        raw = self.optional(row, column)
        return self.parse_number(raw, column, positive=False) if raw else None

    def time_limit(self, row: list[str]) -> float | None:
        raw = self.optional(row, "time_limit_s")
        return self.parse_number(raw, "time_limit_s", positive=True) if raw else None

    def after_ok(self, row: list[str]) -> tuple[str, ...]:
        ids = tuple(self.optional(row, "after_ok").split())
        for job_id in ids:
            if not _TOKEN.fullmatch(job_id):
                raise self.error(f"expected job ids, got {job_id!r}", "after_ok")
        return ids

    def check_dependencies(self, jobs: list[TraceJob]) -> None:
        owners = {job.id: job.user for job in jobs}
        for job in jobs:
            for needed in job.after_ok:
                if owners.get(needed) != job.user:
                    raise TraceError(
                        self.source,
                        f"job {job.id!r} waits for {needed!r}, which is no job of "
                        f"{job.user!r} in this trace (column after_ok)",
                        line=job.line,
                    )


class _PhillyRows(_Rows):
    def read(self, reader: CsvReader) -> Trace:
        rows: list[tuple[datetime, str, str, int, float, int]] = []
        seen: set[str] = set()
        for data_row, row in self.rows(reader):
            raw_time = self.text(row, "timestamp")
            try:
                stamp = datetime.fromisoformat(raw_time)
            except ValueError:
                raise self.error(
                    f"expected a date-time like 2017-10-09 07:01:55, got {raw_time!r}",
                    "timestamp",
                ) from None
            if stamp.tzinfo is not None:
                stamp = stamp.astimezone(UTC).replace(tzinfo=None)
            self.number(row, "gpu_time", positive=False)
            job_id = self.job_id(row, data_row, seen)
            user = self.token(row, "cluster")
            gpus = self.count(row, "num_gpus")
            duration = self.number(row, "duration", positive=True)
            rows.append((stamp, job_id, user, gpus, duration, self.line))
        first = min((row[0] for row in rows), default=None)
        jobs = [
            TraceJob(job_id, user, gpus, (stamp - first).total_seconds(), duration, None, line)
            for stamp, job_id, user, gpus, duration, line in rows
            if first is not None
        ]
        return _finish(jobs, {}, self.source, "philly")


def _finish(jobs: list[TraceJob], tickets: dict[str, float], source: str, form: str) -> Trace:
    jobs.sort(key=lambda job: job.submit_s)  # stable: ties keep file order
    return Trace(jobs=tuple(jobs), tickets=tickets, source=source, format=form)


def write_trace(trace: Trace, stream: IO[str]) -> None:
    """`trace` as gfair CSV (`submit_time_s,user,gpus,duration_s,job_type,tickets,job_id`),
    a user's tickets on its first row; `read_trace` reads it back as the same jobs."""
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow((*GFAIR_REQUIRED, "job_type", "tickets", "job_id"))
    ticketed: set[str] = set()
    for job in trace.jobs:
        tickets = trace.tickets.get(job.user)
        first = job.user not in ticketed
        ticketed.add(job.user)
        writer.writerow(
            (
                _number(job.submit_s),
                job.user,
                job.gpus,
                _number(job.duration_s),
                job.job_type or "",
                f"{tickets:g}" if tickets is not None and first else "",
                job.id,
            )
        )


def _number(value: float) -> str:
    """Exact, and without a ".0" on whole numbers."""
    return str(int(value)) if value.is_integer() else repr(value)


def read_gavel_trace(
    path: str | Path, rates: Mapping[tuple[str, int], Mapping[str, float]]
) -> Trace:
    """Gavel's trace format (``scheduler/utils.py: parse_trace``), one job per line, ten
    tab-separated fields: ``job_type, command, working_directory, num_steps_arg,
    needs_data_dir, total_steps, scale_factor, priority_weight, SLO, arrival_time``.

    Mapping: job i (0-based line order) becomes job ``i`` of its own user ``job-i`` (Gavel's
    traces have no users), with ``priority_weight`` as its tickets; ``scale_factor`` is its
    GPU count, ``arrival_time`` its submission (s); its V100 run time is ``total_steps`` over
    the V100 steps/s that `rates` (Gavel's table, ``(job_type, gpus) -> generation -> steps/s``)
    gives its type at its scale; ``job_type`` is kept. Command, directory, data flag and SLO
    are dropped.
    """
    source = str(path)
    jobs: list[TraceJob] = []
    tickets: dict[str, float] = {}
    try:
        with _open_text(Path(path)) as stream:
            lines = list(stream)
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as error:
        raise TraceError(source, f"cannot read: {error}") from error
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) != 10:
            raise TraceError(
                source, f"expected 10 tab-separated fields, got {len(fields)}", line_number
            )
        job_type = fields[0].strip()
        try:
            total_steps, gpus = float(fields[5]), int(fields[6])
            weight, arrival = float(fields[7]), float(fields[9])
        except ValueError as error:
            raise TraceError(source, f"bad number: {error}", line_number) from None
        v100 = rates.get((job_type, gpus), {}).get("v100", 0.0)
        if not (v100 > 0 and total_steps > 0 and gpus >= 1 and weight > 0 and arrival >= 0):
            raise TraceError(
                source,
                f"job type {job_type!r} on {gpus} GPU(s): need a V100 rate in the table, "
                "total_steps > 0, scale_factor >= 1, priority_weight > 0, arrival_time >= 0",
                line_number,
            )
        index = len(jobs)
        user = f"job-{index}"
        tickets[user] = weight
        jobs.append(
            TraceJob(str(index), user, gpus, arrival, total_steps / v100, job_type, line_number)
        )
    return _finish(jobs, tickets, source, "gavel")
