"""gfair.bus."""
