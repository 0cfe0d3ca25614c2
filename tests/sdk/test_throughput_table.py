from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gfair.sdk.throughput_table import (
    ASSUMED_SPEEDUP_OVER_V100,
    ThroughputLookupError,
    ThroughputTable,
)

SPEEDUPS_CSV = Path(__file__).resolve().parents[2] / "data" / "gavel_speedups.csv"


@pytest.fixture(scope="module")
def table() -> ThroughputTable:
    return ThroughputTable.load()


def test_matches_the_flattened_csv_for_every_row(table: ThroughputTable) -> None:
    # gavel_speedups.csv was derived independently from the same JSON: every number must agree.
    with SPEEDUPS_CSV.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) > 80
    for row in rows:
        gpus = int(row["scale_factor"])
        for generation in ("k80", "p100", "v100"):
            expected = float(row[f"{generation}_steps_per_s"])
            got = table.steps_per_s(row["job_type"], generation, gpus)
            assert got == pytest.approx(expected), (row["job_type"], generation, gpus)


def test_resnet50_is_about_six_times_faster_on_v100_than_k80(table: ThroughputTable) -> None:
    job = "ResNet-50 (batch size 32)"
    assert table.steps_per_s(job, "v100") / table.steps_per_s(job, "k80") == pytest.approx(
        6.2975, rel=1e-3
    )


def test_newer_generations_use_the_documented_assumption(table: ThroughputTable) -> None:
    job = "Transformer (batch size 64)"
    v100 = table.steps_per_s(job, "v100", 2)
    for generation, factor in ASSUMED_SPEEDUP_OVER_V100.items():
        assert table.steps_per_s(job, generation, 2) == pytest.approx(factor * v100)


def test_lookup_errors_say_what_is_wrong(table: ThroughputTable) -> None:
    with pytest.raises(ThroughputLookupError, match="did you mean 'ResNet-50 \\(batch size 32\\)'"):
        table.steps_per_s("ResNet-50 (batch size 31)", "v100")
    with pytest.raises(ThroughputLookupError, match="generation 'tpu'"):
        table.steps_per_s("A3C", "tpu")
    with pytest.raises(ThroughputLookupError, match="measured: \\[1\\]"):
        table.steps_per_s("A3C", "v100", 3)


def test_missing_table_points_at_the_override(tmp_path: Path) -> None:
    with pytest.raises(ThroughputLookupError, match="GFAIR_THROUGHPUTS"):
        ThroughputTable.load(tmp_path / "nope.json")
