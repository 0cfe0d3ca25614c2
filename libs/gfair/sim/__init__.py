"""gfair.sim."""
