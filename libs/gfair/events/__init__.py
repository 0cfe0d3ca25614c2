"""gfair.events."""
