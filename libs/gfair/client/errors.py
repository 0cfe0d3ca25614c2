"""What can go wrong talking to a gfair cluster, each with a message a user can act on."""

from __future__ import annotations


class ClientError(Exception):
    """Base of every error the client raises on purpose."""


class NotReachable(ClientError):
    """No NATS server answered at the given URLs."""


class NoCluster(ClientError):
    """NATS answered, but holds no gfair cluster (its streams or buckets are missing)."""


class UnknownJob(ClientError):
    """No record and no event of that job exists."""


class WaitTimeout(ClientError):
    """The job did not reach the awaited state in time (it may still get there)."""
