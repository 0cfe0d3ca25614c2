"""Whether the embedded cluster's parts serve: executors registered, services pulling, query
answering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import nats.errors

from gfair.bus.history import read_history
from gfair.bus.nats_bus import NatsBus
from gfair.client.query_access import ask_query
from gfair.events.nodes import NodeRegistered
from gfair.events.subjects import NODES_STREAM, STREAMS
from gfair.tenancy import OPERATOR_USER

# A pull a killed process left waiting expires within its fetch timeout (the runner's 1 s).
_PULLS_EXPIRE = timedelta(seconds=2)


async def registered_since(bus: NatsBus, since: datetime) -> set[str]:
    """The nodes that registered at or after `since`."""
    found: set[str] = set()
    async for past in read_history(
        bus,
        NODES_STREAM.name,
        filter_subjects=(NodeRegistered.subject_pattern(),),
        accepts=(NodeRegistered,),
    ):
        if past.envelope.time >= since and isinstance(past.data, NodeRegistered):
            found.add(past.data.node_id)
    return found


async def answering(bus: NatsBus) -> bool:
    """Whether the query service answers (it has no consumer to look for)."""
    try:
        # As the operator: the service answers only on the inbox of the user it is asked
        # about, and this connection may read any inbox.
        await ask_query(bus.client, OPERATOR_USER, "nodes", b"{}", timeout_s=0.5)
    except (nats.errors.Error, TimeoutError):
        return False
    return True


async def consuming(
    bus: NatsBus, services: set[str], incarnation: datetime | None = None
) -> set[str]:
    """Services with a consumer that a live process is pulling from right now.

    With `incarnation` (when the process started), only its own pulls count: a delivery
    it acknowledged, or a pull waiting once the killed process's pulls have expired.
    """
    js = bus.client.jetstream()
    pulling: set[str] = set()
    expired = incarnation is not None and datetime.now(UTC) >= incarnation + _PULLS_EXPIRE
    for stream in STREAMS:
        try:
            consumers = await js.consumers_info(stream.name)
        except Exception:  # the stream may not have consumers yet
            continue
        for info in consumers:
            name = info.name or ""
            waiting = (info.num_waiting or 0) > 0
            if incarnation is None:
                pulled = waiting or (info.num_ack_pending or 0) > 0
            else:
                acked = info.ack_floor.last_active if info.ack_floor else None
                pulled = (acked is not None and acked >= incarnation) or (waiting and expired)
            if pulled:
                pulling.update(s for s in services if name.startswith(f"{s}-"))
    return pulling
