"""The Gavel throughput table reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gfair
from gfair.gavel import (
    ENV_THROUGHPUTS,
    PACKAGED_THROUGHPUTS,
    default_throughputs_path,
    load_scaled_throughputs,
    load_throughputs,
)


def test_the_default_table_gives_one_gpu_rates_per_type_and_generation() -> None:
    table = load_throughputs()
    assert len(table) == 26
    resnet = table["ResNet-18 (batch size 16)"]
    assert set(resnet) == {"k80", "p100", "v100"}
    assert resnet["k80"] == pytest.approx(4.795294551566172)
    assert all(rate >= 0 for rates in table.values() for rate in rates.values())


def test_scale_factors_and_unconsolidated_gangs_are_available() -> None:
    scaled = load_scaled_throughputs()
    assert {gpus for _, gpus in scaled} == {1, 2, 4, 8}
    spread = load_scaled_throughputs(consolidated=False)
    key = ("LM (batch size 10)", 8)
    assert spread[key]["v100"] < scaled[key]["v100"]  # a gang over servers is slower


def test_the_default_path_is_the_packaged_table_unless_overridden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_THROUGHPUTS, raising=False)
    path = default_throughputs_path()
    assert path == PACKAGED_THROUGHPUTS
    assert path.is_relative_to(Path(gfair.__file__).parent)
    custom = tmp_path / "t.json"
    custom.write_text(json.dumps({"k80": {"('X', 1)": {"null": 0.0}}}))
    monkeypatch.setenv(ENV_THROUGHPUTS, str(custom))
    assert load_throughputs() == {"X": {"k80": 0.0}}  # zero kept: does not fit


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "expected an object of generations"),
        ('{"k80": {"X": {"null": 1}}}', "key 'X' is not"),
        ('{"k80": {"(\'X\', 0)": {"null": 1}}}', "is not"),
        ('{"k80": {"(\'X\', 1)": {"null": -1}}}', "k80.('X', 1).null: expected a rate >= 0"),
        ("{", "not JSON"),
    ],
)
def test_malformed_tables_are_rejected_naming_the_place(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(ValueError) as error:
        load_throughputs(path)
    assert message in str(error.value)


def test_a_missing_table_names_the_variable_to_set(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=ENV_THROUGHPUTS):
        load_throughputs(tmp_path / "missing.json")
