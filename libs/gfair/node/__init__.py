"""gfair.node."""
