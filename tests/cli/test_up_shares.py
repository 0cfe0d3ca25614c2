"""`gfair up --shares FILE`: the file is checked before anything starts, and every service is
told where it is (`GFAIR_SHARES_FILE`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gfair.cli.main import main
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster


def test_a_bad_shares_file_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "shares.toml"
    bad.write_text("[accounts.lab]\ntickets = -1\n")
    data = tmp_path / "data"
    assert main(["up", "--shares", str(bad), "--data-dir", str(data)]) == 2
    assert "shares.toml:1: accounts.lab: tickets" in capsys.readouterr().err
    assert not data.exists()


def test_every_service_is_given_the_shares_file(tmp_path: Path) -> None:
    shares = tmp_path / "shares.toml"
    shares.write_text("[accounts.lab]\n")
    options = ClusterOptions(
        nats_url="nats://127.0.0.1:1", data_dir=tmp_path, shares_file=Path(os.path.relpath(shares))
    )
    assert EmbeddedCluster(options).child_env()["GFAIR_SHARES_FILE"] == str(shares.resolve())
    without = ClusterOptions(nats_url="nats://127.0.0.1:1", data_dir=tmp_path)
    env = EmbeddedCluster(without).child_env()
    assert env.get("GFAIR_SHARES_FILE") == os.environ.get("GFAIR_SHARES_FILE")
