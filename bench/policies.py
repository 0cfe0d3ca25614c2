"""Policies x workloads: gandiva-fair against max-min fairness, Tiresias and FIFO.

Run: ``.venv/bin/python -m bench.policies [--quick] [gfair compare options ...]``

The same code as ``gfair compare`` (`gfair.sim.comparison`): the standard workloads (every
Philly virtual cluster with 300 or more jobs, a Gavel-style 500-job trace, multi-user
workloads with unequal tickets, each on a 1:1:1 V100:P100:K80 and a 12:128 V100:K80 cluster,
and the homogeneous 108-V100 control), 360 s quanta, one table and a PNG of the JCT CDFs
(``bench-policies.png`` in the current directory unless ``--plot`` says otherwise). The wall
time printed under the table is the whole comparison's; each row has its replay's.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gfair.cli.main import main as gfair

DEFAULT_PLOT = "bench-policies.png"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--plot" not in args:
        args += ["--plot", DEFAULT_PLOT]
    return gfair(["compare", *args])


if __name__ == "__main__":
    sys.exit(main())
