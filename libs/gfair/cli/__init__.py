"""The `gfair` command line."""
