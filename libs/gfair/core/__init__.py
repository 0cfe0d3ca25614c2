"""The pure scheduling core: no I/O, no clock, no randomness of its own.

Time and seeds are arguments, so the live services and the trace simulator drive the very
same functions (DESIGN 3.4).
"""
