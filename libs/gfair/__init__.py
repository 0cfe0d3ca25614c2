"""gfair: a fair-share scheduler for multi-tenant, heterogeneous GPU clusters."""

__version__ = "0.1.0"
