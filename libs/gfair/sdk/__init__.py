"""gfair.sdk."""
