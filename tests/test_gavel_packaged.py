"""The packaged table is exactly the shared table's alone rates."""

from __future__ import annotations

from gfair.gavel import PACKAGED_THROUGHPUTS, default_throughputs_path, load_scaled_throughputs


def test_packaged_table_matches_the_shared_measurements() -> None:
    shared = default_throughputs_path()
    assert shared != PACKAGED_THROUGHPUTS, "the shared data folder should be beside the repo"
    for consolidated in (True, False):
        assert load_scaled_throughputs(PACKAGED_THROUGHPUTS, consolidated=consolidated) == (
            load_scaled_throughputs(shared, consolidated=consolidated)
        )
