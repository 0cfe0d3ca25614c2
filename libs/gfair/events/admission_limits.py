"""Placement's default admission limits, shared with the tools that check flags before sending.

The event schema's bounds (`gfair.events.fields`) are what any deployment may accept at all;
these are the tighter defaults placement admits (each an operator setting, ``GFAIR_MAX_JOB_GPUS``
and friends). Kept here, not in placement's settings, so that `gfair submit` can refuse a
request placement would reject without importing the services.
"""

from __future__ import annotations

from typing import Final

# The Philly trace's largest job asks for 128 GPUs; twice that is a typo, not a job.
MAX_JOB_GPUS: Final = 256
MAX_JOB_TICKETS: Final = 1000.0
MAX_JOB_GPUS_ENV: Final = "GFAIR_MAX_JOB_GPUS"
