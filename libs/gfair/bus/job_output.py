"""A job's output (stdout, stderr) in JetStream, so it outlives the node and the container.

The node executor ships what each run of a job writes to its ``stdout.log`` and ``stderr.log``
as chunks on ``gfair.logs.<user>.<job_id>.<stdout|stderr>.<node>``, stored in the
``GFAIR_LOGS`` stream with bounded retention (by age and by size, oldest dropped first), and
`gfair logs` reads them back. The node that ran it is the subject's last token, so NATS holds
each executor to its own node's output. These are not events of the contract: the payload is
the output's bytes as written, the headers say where in the run's file they go:

| header | value |
|---|---|
| ``Gfair-Run`` | the run directory (``run-0003``): a new one per start or resume on that node |
| ``Gfair-Offset`` | byte offset of the chunk in that run's file |
| ``Gfair-End`` | ``1`` on the empty chunk that closes a run's file once its process has exited |

Each chunk's message id names node, run, output and offset, so a chunk shipped twice (an
executor restarting) is stored once.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass

from gfair.bus.topology import Storage, StreamSpec
from gfair.bus.transport import Bus, PubAck, StoredMessage
from gfair.events.subjects import PREFIX, validate_token

LOGS_STREAM = "GFAIR_LOGS"
OUTPUTS = ("stdout", "stderr")
DEFAULT_MAX_AGE_S = 7 * 86_400.0
DEFAULT_MAX_BYTES = 1 << 30
# Chunks kept per subject (one job's one output from one node), oldest dropped first: a job that
# floods its output pushes out its own chunks, not every tenant's. About a chunk a second for
# hours of a job that prints steadily.
DEFAULT_MAX_MSGS_PER_SUBJECT = 10_000
# Well under NATS' default 1 MiB payload limit.
MAX_CHUNK_BYTES = 64 * 1024

_RUN, _OFFSET, _END, _LEGACY_NODE = "Gfair-Run", "Gfair-Offset", "Gfair-End", "Gfair-Node"


def output_subject(user: str, job_id: str, output: str, node: str) -> str:
    if output not in OUTPUTS:
        raise ValueError(f"output {output!r}: one of {', '.join(OUTPUTS)}")
    return f"{PREFIX}.logs.{user}.{job_id}.{output}.{validate_token(node, what='node id')}"


def job_output_pattern(user: str, job_id: str) -> str:
    return f"{PREFIX}.logs.{user}.{job_id}.>"


def node_output_pattern(node: str) -> str:
    """Every output one node may ship (what its executor is allowed to publish)."""
    return f"{PREFIX}.logs.*.*.*.{validate_token(node, what='node id')}"


def job_output_stream(
    *,
    replicas: int = 1,
    storage: Storage = Storage.FILE,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_msgs_per_subject: int = DEFAULT_MAX_MSGS_PER_SUBJECT,
) -> StreamSpec:
    return StreamSpec(
        name=LOGS_STREAM,
        subjects=(f"{PREFIX}.logs.>",),
        description="What jobs write to stdout and stderr, per job, with bounded retention",
        max_age_s=max_age_s,
        max_bytes=max_bytes,
        max_msgs_per_subject=max_msgs_per_subject,
        storage=storage,
        replicas=replicas,
    )


@dataclass(frozen=True)
class OutputChunk:
    """Bytes a run wrote to one of its outputs, from `offset` on (or the end of that file)."""

    output: str
    node: str
    run: str
    offset: int
    data: bytes
    end: bool = False
    sequence: int = 0  # in the stream, once stored

    def headers(self) -> dict[str, str]:
        headers = {_RUN: self.run, _OFFSET: str(self.offset)}
        if self.end:
            headers[_END] = "1"
        return headers

    @classmethod
    def from_message(cls, message: StoredMessage) -> OutputChunk | None:
        """The chunk a stored message holds; None for one that is not (a stray publish)."""
        tokens = message.subject.split(".")
        headers: Mapping[str, str] = message.headers or {}
        if len(tokens) not in (5, 6) or tokens[4] not in OUTPUTS or _RUN not in headers:
            return None
        # Chunks stored before the node joined the subject named it in a header.
        node = tokens[5] if len(tokens) == 6 else headers.get(_LEGACY_NODE, "")
        try:
            offset = int(headers.get(_OFFSET, ""))
            validate_token(node, what="node id")
        except ValueError:  # SubjectError is one
            return None
        return cls(
            output=tokens[4],
            node=node,
            run=headers[_RUN],
            offset=offset,
            data=message.data,
            end=headers.get(_END) == "1",
            sequence=message.sequence,
        )


async def publish_chunk(bus: Bus, user: str, job_id: str, chunk: OutputChunk) -> PubAck:
    tail = ".end" if chunk.end else ""
    return await bus.publish(
        output_subject(user, job_id, chunk.output, chunk.node),
        chunk.data,
        headers=chunk.headers(),
        msg_id=f"log.{chunk.node}.{user}.{job_id}.{chunk.run}.{chunk.output}.{chunk.offset}{tail}",
    )


async def read_output(
    bus: Bus, user: str, job_id: str, *, start_sequence: int = 1
) -> AsyncGenerator[OutputChunk, None]:
    """The job's chunks stored so far, from `start_sequence` on, in the order stored."""
    async for message in bus.history(
        LOGS_STREAM,
        filter_subjects=(job_output_pattern(user, job_id),),
        start_sequence=start_sequence,
    ):
        chunk = OutputChunk.from_message(message)
        if chunk is not None:
            yield chunk
