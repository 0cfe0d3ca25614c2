"""Derive the packaged throughput table from data/gavel_throughputs.json.

Gavel's file (1.2 MB) also holds the rates of packed job pairs, which gfair does not use. This
keeps only each job type's rate when it runs alone ("null"), in the same layout, so that the
wheel and the container image carry measured speeds at a thirtieth of the size:

    python scripts/derive_gavel_table.py > libs/gfair/data/gavel_alone.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "data" / "gavel_throughputs.json"


def main() -> None:
    raw = json.loads(SOURCE.read_text(encoding="utf-8"))
    alone = {
        generation: {key: {"null": rates["null"]} for key, rates in sorted(entries.items())}
        for generation, entries in sorted(raw.items())
    }
    json.dump(alone, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
