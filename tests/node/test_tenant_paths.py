"""Directories root makes where a job can write: a link, a file or a stranger's directory in
their place is refused, and what it points at is left alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gfair.node.job_account import JobAccount
from gfair.node.job_files import NotOwnFile
from gfair.node.tenant_paths import exists_in, made, make_job_directory, owners, remove_in

ACCOUNT = JobAccount(200_123, 200_123)


def test_a_missing_directory_is_made_and_given_to_the_account(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root gives directories away")
    make_job_directory(tmp_path, "job", ACCOUNT)
    info = (tmp_path / "job").stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (200_123, 200_123, 0o700)


def test_a_link_or_a_file_in_a_directorys_place_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotOwnFile, match="link is a symbolic link"):
        make_job_directory(tmp_path, "link", None)
    with pytest.raises(NotOwnFile, match="file is not a directory"), made(tmp_path, "file"):
        pass
    assert target.stat().st_mode & 0o777 == 0o755


def test_a_directory_of_another_account_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root makes a directory of another account")
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", 200_999, 200_999)
    with pytest.raises(NotOwnFile, match="belongs to uid 200999"):
        make_job_directory(tmp_path, "theirs", ACCOUNT)
    assert (tmp_path / "theirs").stat().st_uid == 200_999


def test_a_file_is_neither_removed_nor_seen_through_a_link(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "marker").write_text("")
    (tmp_path / "mine").symlink_to(other)
    with pytest.raises(NotOwnFile):
        remove_in(tmp_path / "mine", "marker", owners(None))
    assert (other / "marker").exists()
    assert not exists_in(tmp_path / "mine", "marker")
    assert exists_in(other, "marker")
    remove_in(other, "marker", owners(None))
    assert not exists_in(other, "marker")
