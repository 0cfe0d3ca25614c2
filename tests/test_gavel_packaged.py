"""The packaged table is exactly the alone rates of Gavel's full table in `data/`."""

from __future__ import annotations

from pathlib import Path

from gfair.gavel import PACKAGED_THROUGHPUTS, load_scaled_throughputs

FULL_TABLE = Path(__file__).resolve().parents[1] / "data" / "gavel_throughputs.json"


def test_packaged_table_matches_the_full_measurements() -> None:
    # The packaged copy is derived (scripts/derive_gavel_table.py); a re-derivation that dropped
    # or changed a rate would silently change every default speed.
    for consolidated in (True, False):
        assert load_scaled_throughputs(PACKAGED_THROUGHPUTS, consolidated=consolidated) == (
            load_scaled_throughputs(FULL_TABLE, consolidated=consolidated)
        )
