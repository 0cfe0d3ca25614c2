"""Reference data shipped inside the package, so that an installed gfair needs nothing beside it.

- `philly_trace.csv.xz`: Microsoft's Philly cluster trace (Jeon et al., USENIX ATC 2019), from
  `msr-fiddle/philly-traces` (CC-BY-4.0, Microsoft) as converted by `petuum/adaptdl`
  (Apache-2.0).
- `gavel_alone.json`: throughputs measured by Gavel (`stanford-futuredata/gavel`, MIT).

How each file was made, and the full Gavel table, are in `data/README.md` of the repository.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

# 82,247 jobs of Microsoft's Philly cluster, Sept-Dec 2017: the default trace of `gfair simulate`.
PHILLY_TRACE = _HERE / "philly_trace.csv.xz"

# Gavel's measured rates of each job type running alone, derived from
# data/gavel_throughputs.json by scripts/derive_gavel_table.py (packed-pair rates left out).
GAVEL_ALONE = _HERE / "gavel_alone.json"

__all__ = ["GAVEL_ALONE", "PHILLY_TRACE"]
