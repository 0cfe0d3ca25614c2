"""What one user may see of the scheduler's records: its own part, and the cluster's shape.

The query service answers a tenant with these cuts of the records the services keep, never the
records themselves: other users' jobs, usage, entitlements and profiles are left out. What is
kept is what a user needs to read its own standing: the cluster's capacity and servers, and the
trades it took part in (with the other party, as in any auction that clears by name).
"""

from __future__ import annotations

from gfair.state.node_record import NodeRecord
from gfair.state.share_record import SharesRecord
from gfair.state.stride_record import StrideRecord


def own_shares(record: SharesRecord, user: str) -> SharesRecord:
    """Its own share, its trades, and of the accounts only those above it."""
    above: set[str] = set()
    path = record.members.get(user, "")
    while path:
        above.add(path)
        path = path.rpartition("/")[0]
    return record.model_copy(
        update={
            "users": {name: share for name, share in record.users.items() if name == user},
            "trades": tuple(t for t in record.trades if user in (t.buyer, t.seller)),
            "accounts": {p: a for p, a in record.accounts.items() if p in above},
            "members": {name: p for name, p in record.members.items() if name == user},
            "shares": "",  # the whole tree: everyone's tickets
        }
    )


def own_stride(record: StrideRecord, user: str) -> StrideRecord:
    return record.model_copy(
        update={
            "users": {name: u for name, u in record.users.items() if name == user},
            "profiles": {name: p for name, p in record.profiles.items() if name == user},
            "jobs": {key: job for key, job in record.jobs.items() if job.user == user},
            "usage": {name: u for name, u in record.usage.items() if name == user},
            "entitlements": {name: e for name, e in record.entitlements.items() if name == user},
            # Ids of other users' events.
            "applied_event_ids": (),
        }
    )


def own_node(record: NodeRecord, user: str) -> NodeRecord:
    """The node with only `user`'s jobs among those it runs and the failures held against it
    (failures of no job, the node's own, stay)."""
    return record.model_copy(
        update={
            "running": tuple(ref for ref in record.running if ref.user == user),
            "recent_failures": tuple(
                f for f in record.recent_failures if f.user is None or f.user == user
            ),
        }
    )
