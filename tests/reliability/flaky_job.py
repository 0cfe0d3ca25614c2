"""A training job whose first run dies of a GPU fault; every later run trains normally.

    python flaky_job.py MARKER [synthetic job arguments...]

The first run (no MARKER file yet) creates MARKER, prints the kernel's report of an NVML XID 79
(GPU fallen off the bus) to stderr and exits 1, as a job does when its GPU disappears under it.
That is an infrastructure failure: the scheduler must retry it elsewhere, and the retry succeeds.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gfair.sdk.synthetic import main


def run(argv: list[str]) -> int:
    marker = Path(argv[0])
    if not marker.exists():
        marker.write_text("failed once\n")
        print(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return main(argv[1:])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
