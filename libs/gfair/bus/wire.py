"""How an envelope travels: the contract's JSON body and headers, plus the type as a header.

The type header lets a consumer (or an operator with the `nats` CLI) see what a message is
without parsing it; the body alone is authoritative.
"""

from __future__ import annotations

import contextlib
from datetime import datetime

from gfair.events.codec import (
    check_arrival,
    publish_headers,
    typed_data,
    verify_subject,
)
from gfair.events.codec import encode as encode_body
from gfair.events.envelope import Envelope, EventData
from gfair.events.subjects import published_by_tenants

CONTENT_TYPE_HEADER = "Content-Type"
EVENT_TYPE_HEADER = "Gfair-Event-Type"
JSON_CONTENT_TYPE = "application/json"


def encode(envelope: Envelope) -> tuple[bytes, dict[str, str]]:
    headers = publish_headers(envelope)
    headers[CONTENT_TYPE_HEADER] = JSON_CONTENT_TYPE
    headers[EVENT_TYPE_HEADER] = envelope.type
    return encode_body(envelope), headers


def validated_data(envelope: Envelope, subject: str) -> EventData:
    """The typed payload, checked against its model and against the subject it came on.

    The subject check is the tenant check: alice may publish on gfair.submit.alice only, so a
    payload for bob arriving there is refused before any handler sees it.
    """
    data = typed_data(envelope)
    check_arrival(envelope, subject)
    # A model that does not say where it is published cannot be checked.
    with contextlib.suppress(NotImplementedError):
        verify_subject(data, subject)
    return data


def server_timed(envelope: Envelope, subject: str, stored_at: datetime) -> Envelope:
    """`envelope` as handlers see it: on a tenant's subject, timed when the stream stored it.

    A tenant writes its envelope's `time` itself; taken as is, it would date its job (and
    order `gfair jobs`) wherever the tenant likes. The server's stored time is as stable
    across redeliveries as the envelope's, so a replayed input still decides the same.
    """
    if not published_by_tenants(subject) or envelope.time == stored_at:
        return envelope
    return envelope.model_copy(update={"time": stored_at})
