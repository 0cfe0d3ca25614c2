"""The shipped NATS configuration on a real nats-server, as in tests/tenancy (its fixtures)."""

from tenancy.conftest import logins, server_env, shipped_server

__all__ = ["logins", "server_env", "shipped_server"]
