"""The pure scheduling core: no I/O, no clock, no randomness of its own.

Time and seeds are arguments, so the live services and the trace simulator drive the very
same functions (docs/design.md §3.4).
"""
