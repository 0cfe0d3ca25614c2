"""The OS account a tenant's jobs run as, when the executor runs as root.

A job runs someone else's code. Run as the executor's own user (root in a container), it could
read other tenants' checkpoints, signal their processes or rewrite the executor's files. With an
account per tenant, each tenant's processes, checkpoints and work directories belong to its own
uid: the kernel's permissions keep tenants apart, and nothing a job does reaches another's.

Accounts are named by the operator (`GFAIR_JOB_ACCOUNTS`, ``tenant=uid[:gid]`` or
``tenant=os-user``): gfair never creates system users. Without a mapping the executor runs jobs
as itself, as before (documented as the fallback in the README's security section).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class JobAccount:
    uid: int
    gid: int

    def own(self, *paths: Path) -> None:
        """Give `paths` to the account, readable by it alone (mode 0700)."""
        for path in paths:
            os.chown(path, self.uid, self.gid)
            path.chmod(0o700)


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
