"""gfair.client."""
