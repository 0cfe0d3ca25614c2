"""A job on the embedded cluster runs gfair's own Python as `python`, whatever the shell that
started `gfair up` had on its PATH (the README's quick start submits `python -m ...`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster, interpreter_first

HERE = str(Path(sys.executable).parent)
NATS = "nats://127.0.0.1:4222"  # never reached: nothing starts


def test_the_interpreters_folder_comes_first_once() -> None:
    assert interpreter_first("/usr/bin:/bin") == os.pathsep.join([HERE, "/usr/bin", "/bin"])
    assert interpreter_first(f"/usr/bin:{HERE}:/bin") == os.pathsep.join([HERE, "/usr/bin", "/bin"])
    assert interpreter_first(None).split(os.pathsep)[0] == HERE


def test_every_child_and_so_every_job_gets_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    options = ClusterOptions(cluster="v100:1x1", nats_url=NATS, data_dir=tmp_path / "gfair")
    assert EmbeddedCluster(options).child_env()["PATH"].split(os.pathsep) == [
        HERE,
        "/usr/bin",
        "/bin",
    ]
    # What the operator sets for the children wins.
    told = ClusterOptions(
        cluster="v100:1x1", nats_url=NATS, data_dir=tmp_path / "g2", env={"PATH": "/opt"}
    )
    assert EmbeddedCluster(told).child_env()["PATH"] == "/opt"
