from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import BinaryIO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.sdk.checkpoint import (
    MANIFEST_NAME,
    STALE_STAGING_S,
    CheckpointError,
    CheckpointStore,
    read_checkpoint,
)


def test_save_then_latest_round_trips_state_and_files(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck")

    def write_weights(fh: BinaryIO) -> None:
        fh.write(b"\x00\x01weights")

    saved = store.save({"step": 7, "lr": 0.1}, step=7, files={"model/w.bin": write_weights})

    latest = store.latest()
    assert latest is not None
    assert latest == read_checkpoint(saved.path)
    assert (latest.seq, latest.step, dict(latest.state)) == (1, 7, {"step": 7, "lr": 0.1})
    assert latest.files == ("model/w.bin",)
    assert latest.file("model/w.bin").read_bytes() == b"\x00\x01weights"


def test_empty_or_missing_directory_has_no_checkpoint(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "never-created").latest() is None
    assert CheckpointStore(tmp_path / "never-created").checkpoints() == []


def test_keeps_the_previous_checkpoint_as_fallback_and_prunes_older(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for step in (10, 20, 30):
        store.save({"step": step}, step=step)

    assert [c.step for c in store.checkpoints()] == [30, 20]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000000002",
        "ckpt-000000000003",
    ]


def test_a_writer_failing_midway_commits_nothing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save({"step": 5}, step=5)

    def crash(fh: BinaryIO) -> None:
        fh.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        store.save({"step": 6}, step=6, files={"model.pt": crash})

    latest = store.latest()
    assert latest is not None and latest.step == 5
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000001"]


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save({"step": 1}, step=1, files={"w": lambda fh: fh.write(b"aaaa")})
    newest = store.save({"step": 2}, step=2, files={"w": lambda fh: fh.write(b"bbbb")})

    (newest.path / "w").write_bytes(b"b")  # truncated by a failing disk

    latest = store.latest()
    assert latest is not None and latest.step == 1
    with pytest.raises(CheckpointError, match="has 1 bytes, expected 4"):
        read_checkpoint(newest.path)


def test_missing_manifest_is_not_a_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    first = store.save({"step": 1}, step=1)
    second = store.save({"step": 2}, step=2)
    (second.path / MANIFEST_NAME).unlink()

    assert store.latest() == first


def test_staging_left_by_a_killed_writer_is_ignored_then_cleaned(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save({"step": 1}, step=1)
    dead = tmp_path / ".staging-2-999999-abcdef"
    dead.mkdir()
    (dead / "model.pt").write_bytes(b"partial")
    long_ago = time.time() - STALE_STAGING_S - 1
    os.utime(dead, (long_ago, long_ago))

    latest = store.latest()
    assert latest is not None and latest.step == 1

    saved = CheckpointStore(tmp_path).save({"step": 3}, step=3)
    assert saved.seq == 3  # never reuses a number a dead writer may have claimed
    assert not dead.exists()


def test_the_parts_of_a_gang_write_side_by_side(tmp_path: Path) -> None:
    """Two writers of one job's checkpoints (a gang's parts on two servers): neither removes
    what the other is writing, and a number the other committed first is skipped."""
    one, other = CheckpointStore(tmp_path), CheckpointStore(tmp_path)
    with one.stage({"step": 5}, step=5) as draft:
        (draft.path / "model.pt").write_bytes(b"weights")
        assert other.save({"step": 5}, step=5).seq == 2  # draft holds 1, and survives
        assert draft.path.exists()
        taken = tmp_path / "ckpt-000000000001"  # the other part committed number 1 meanwhile
        taken.mkdir()
        (taken / "model.pt").write_bytes(b"theirs")
    assert draft.committed is not None and draft.committed.seq == 3
    assert read_checkpoint(draft.committed.path).file("model.pt").read_bytes() == b"weights"


def test_stage_commits_files_written_in_the_block(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    with store.stage({"epoch": 2}, step=40) as draft:
        (draft.path / "optimizer.pt").write_bytes(b"opt")
        assert store.latest() is None  # not visible before the block ends

    assert draft.committed is not None
    assert draft.committed.step == 40
    assert draft.committed.file("optimizer.pt").read_bytes() == b"opt"


def test_stage_discards_everything_on_error(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    with pytest.raises(ValueError, match="boom"), store.stage({}, step=1) as draft:
        (draft.path / "x").write_bytes(b"x")
        raise ValueError("boom")
    assert list(tmp_path.iterdir()) == []


def test_state_must_be_json(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="JSON-serialisable"):
        CheckpointStore(tmp_path).save({"weights": object()}, step=1)
    with pytest.raises(TypeError, match="JSON-serialisable"):
        CheckpointStore(tmp_path).save({"loss": float("nan")}, step=1)


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", MANIFEST_NAME])
def test_file_names_must_stay_inside_and_not_shadow_the_manifest(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        CheckpointStore(tmp_path).save({}, step=1, files={name: lambda fh: fh.write(b"x")})
    assert CheckpointStore(tmp_path).latest() is None


def test_manifest_seq_must_match_directory(tmp_path: Path) -> None:
    saved = CheckpointStore(tmp_path).save({}, step=1)
    manifest = json.loads((saved.path / MANIFEST_NAME).read_text())
    manifest["seq"] = 9
    (saved.path / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="seq 9"):
        read_checkpoint(saved.path)


# A save either completes or crashes part-way (writer raises); whatever the sequence, the
# newest checkpoint is the last completed save and the one before it is still readable.
@settings(max_examples=25, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=8))
def test_latest_is_always_the_last_completed_save(
    tmp_path_factory: pytest.TempPathFactory, outcomes: list[bool]
) -> None:
    root = tmp_path_factory.mktemp("prop")
    store = CheckpointStore(root, keep=2)
    completed: list[int] = []
    for step, succeeds in enumerate(outcomes):

        def writer(fh: BinaryIO, ok: bool = succeeds) -> None:
            fh.write(b"data")
            if not ok:
                raise OSError("killed")

        try:
            store.save({"step": step}, step=step, files={"f": writer})
            completed.append(step)
        except OSError:
            pass
    assert [c.step for c in store.checkpoints()] == list(reversed(completed[-2:]))
