"""The six gfair services: thin shells whose handlers call the core."""
