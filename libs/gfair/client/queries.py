"""The query protocol: what a tool may ask the query service, and what it answers.

A request is published on ``gfair.query.<user>.<what>`` with a JSON body (the `Query` model
of `what`, ``{}`` where it takes nothing) and answered on the requester's inbox with the JSON
of the answer model, or, when the question cannot be answered, an empty body and the header
`ERROR_HEADER` saying why. The service answers for ``<user>`` only: jobs, events and output of
that user's jobs, and the scheduler's records cut down to that user's part. NATS permissions
let a tenant publish on its own ``gfair.query.<tenant>.*`` only, so the subject says who asks.

Long answers come in pages of about `PAGE_BYTES`: an answer's ``next`` is the ``after`` or
``start`` of the next request, None once nothing more was stored when the page was read.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from gfair.client.explanation import Explanation
from gfair.events.envelope import Envelope
from gfair.events.fields import JobId
from gfair.state.job_failures import JobFailureRecord
from gfair.state.job_record import JobRecord
from gfair.state.node_record import NodeRecord
from gfair.state.profile_record import JobProfileRecord
from gfair.state.share_record import SharesRecord
from gfair.state.stride_record import StrideRecord

ERROR_HEADER: Final = "Gfair-Query-Error"
# Under NATS's default 1 MiB message limit with room for the JSON around the items; a single
# item larger than this still goes out, alone on its page.
PAGE_BYTES: Final = 256 * 1024


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NoQuery(_Message):
    """The body of a question that takes nothing: ``{}``."""


class JobsQuery(_Message):
    after: JobId | None = Field(default=None, description="The last job id of the page before")


class JobsPage(_Message):
    records: tuple[JobRecord, ...]
    next: JobId | None = None


class JobQuery(_Message):
    job_id: JobId


class JobAnswer(_Message):
    record: JobRecord | None = None
    profile: JobProfileRecord | None = None
    failures: JobFailureRecord | None = None


class EventsQuery(_Message):
    job_id: JobId | None = Field(default=None, description="None: every job of the user")
    start: int = Field(default=1, ge=1, description="The stream sequence to read from")


class StoredEvent(_Message):
    sequence: int = Field(ge=1)
    subject: str
    envelope: Envelope


class EventsPage(_Message):
    events: tuple[StoredEvent, ...]
    next: int | None = None


class OutputQuery(_Message):
    job_id: JobId
    start: int = Field(default=1, ge=1)


class StoredChunk(_Message):
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    output: str
    node: str
    run: str
    offset: int = Field(ge=0)
    data: bytes
    end: bool = False
    sequence: int = Field(ge=1)


class OutputPage(_Message):
    chunks: tuple[StoredChunk, ...]
    next: int | None = None


class SharesAnswer(_Message):
    record: SharesRecord | None = None


class StrideAnswer(_Message):
    record: StrideRecord | None = None


class NodesAnswer(_Message):
    records: tuple[NodeRecord, ...]


class WhyAnswer(_Message):
    explanation: Explanation


# What each question is called on the subject, what it takes and what it answers.
QUERIES: Final[dict[str, tuple[type[BaseModel], type[BaseModel]]]] = {
    "jobs": (JobsQuery, JobsPage),
    "job": (JobQuery, JobAnswer),
    "events": (EventsQuery, EventsPage),
    "output": (OutputQuery, OutputPage),
    "shares": (NoQuery, SharesAnswer),
    "stride": (NoQuery, StrideAnswer),
    "nodes": (NoQuery, NodesAnswer),
    "why": (JobQuery, WhyAnswer),
}
