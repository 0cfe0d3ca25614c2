"""The OS account a tenant's jobs run as, when the executor runs as root.

A job runs someone else's code. Run as the executor's own user (root in a container), it could
read other tenants' checkpoints, signal their processes or rewrite the executor's files. With an
account per tenant, each tenant's processes, checkpoints and work directories belong to its own
uid: the kernel's permissions keep tenants apart, and nothing a job does reaches another's.

Accounts are named by the operator (`GFAIR_JOB_ACCOUNTS`, ``tenant=uid[:gid]`` or
``tenant=os-user``), and every tenant the mapping does not name gets one derived from its name
(`derived_account`): uid and gid ``GFAIR_JOB_UID_BASE + sha256(tenant) mod JOB_UID_RANGE``. The
kernel needs no ``/etc/passwd`` entry to run a process as a number, and a number that depends on
the tenant's name alone is the same on every executor and after every restart, so the
checkpoints one node wrote (a shared filesystem) belong to the same uid on the next. Two tenants
whose names fall on one uid are refused (`check_distinct`) rather than merged: the operator then
names an account for one of them. gfair never creates system users. An executor that is not
root cannot switch users at all: its jobs run as itself.
"""

from __future__ import annotations

import hashlib
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Derived uids lie in [base, base + JOB_UID_RANGE): above the usual system and login ranges
# (and the 100000-165535 block container runtimes give their first user namespace).
DEFAULT_JOB_UID_BASE = 200_000
JOB_UID_RANGE = 1 << 16
_MAX_UID = (1 << 32) - 2  # (uid_t)-1 means "no change" to setresuid


class AccountError(ValueError):
    """No account a tenant's jobs may run as: the message says why and what to set."""


@dataclass(frozen=True, slots=True)
class JobAccount:
    uid: int
    gid: int


def parse_account(text: str) -> JobAccount:
    """``uid[:gid]`` (gid defaults to uid) or the name of an OS user (its uid and group)."""
    uid_text, _, gid_text = text.partition(":")
    if uid_text.isdigit():
        uid = int(uid_text)
        gid = int(gid_text) if gid_text.isdigit() else uid
        if gid_text and not gid_text.isdigit():
            raise ValueError(f"job account {text!r}: the gid must be a number")
        if uid == 0 or gid == 0:
            raise ValueError(f"job account {text!r}: jobs never run as root")
        return JobAccount(uid, gid)
    try:
        entry = pwd.getpwnam(text)
    except KeyError:
        raise ValueError(f"job account {text!r}: no such OS user") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise ValueError(f"job account {text!r}: jobs never run as root")
    return JobAccount(entry.pw_uid, entry.pw_gid)


def parse_accounts(entries: Mapping[str, str]) -> dict[str, JobAccount]:
    """Tenant -> account, each checked (see `parse_account`); one uid serves one tenant."""
    accounts = {tenant: parse_account(text) for tenant, text in entries.items()}
    owners: dict[int, str] = {}
    for tenant, account in sorted(accounts.items()):
        other = owners.setdefault(account.uid, tenant)
        if other != tenant:
            raise ValueError(
                f"job accounts: tenants {other} and {tenant} share uid {account.uid}; "
                "each tenant needs its own"
            )
    return accounts


def check_uid_base(base: int) -> int:
    if base < 1000 or base + JOB_UID_RANGE - 1 > _MAX_UID:
        raise AccountError(
            f"job uid base {base}: derived uids [{base}, {base + JOB_UID_RANGE}) must lie "
            f"between 1000 and {_MAX_UID}"
        )
    return base


def derived_account(tenant: str, base: int = DEFAULT_JOB_UID_BASE) -> JobAccount:
    """The account of a tenant no mapping names: its uid (and gid) from its name alone."""
    digest = hashlib.sha256(tenant.encode()).digest()
    uid = check_uid_base(base) + int.from_bytes(digest[:8], "big") % JOB_UID_RANGE
    return JobAccount(uid, uid)


def check_distinct(tenant: str, account: JobAccount, others: Mapping[str, JobAccount]) -> None:
    """Raise `AccountError` if another tenant in `others` runs as `account`'s uid."""
    for other, theirs in sorted(others.items()):
        if other != tenant and theirs.uid == account.uid:
            raise AccountError(
                f"tenants {other} and {tenant} would both run jobs as uid {account.uid}; "
                f"name an account for one of them in GFAIR_JOB_ACCOUNTS"
            )


def owners_of(root: Path) -> dict[str, JobAccount]:
    """Tenant -> account, from the tenant directories under a checkpoint root (each is owned by
    its tenant's account): what every executor sharing the root has decided so far."""
    found: dict[str, JobAccount] = {}
    try:
        entries = list(root.iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            stat = entry.lstat()
        except OSError:
            continue
        if entry.is_dir() and not entry.is_symlink() and stat.st_uid != 0:
            found[entry.name] = JobAccount(stat.st_uid, stat.st_gid)
    return found
