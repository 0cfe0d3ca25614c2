"""The query service: tenants read their own jobs, events, output and standing through it.

See `gfair.client.queries` for the protocol and docs/design.md §3.6.
"""

from gfair_services.query.service import SERVICE_NAME, QueryService, serve
from gfair_services.query.settings import QuerySettings

Settings = QuerySettings

__all__ = ["SERVICE_NAME", "QueryService", "QuerySettings", "Settings", "serve"]
