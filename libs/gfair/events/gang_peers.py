"""What each part of a gang that spans servers finds in its environment to meet the others.

A job larger than a server runs on several servers at once (split stride's central
coordination starts every part in the same quantum). Its processes still have to find each
other: split-stride adds these variables to the start command of every part, over the job's
own `env`, as the launchers of distributed training expect them:

- ``MASTER_ADDR``, ``MASTER_PORT``: where the first part (node rank 0) listens, for
  ``torch.distributed``'s ``env://`` initialisation (and Lightning, DeepSpeed, ...);
- ``NODE_RANK``, ``NNODES``: this part's place among the job's servers, and how many there are;
- ``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``,
  ``PET_NPROC_PER_NODE``: the same for ``torchrun``, which reads its options from ``PET_*``
  variables, so ``torchrun train.py`` needs no flags (one process per GPU of the part).

The port is derived from the job, its attempt and its servers, in 20000-49999, so every part
computes the same one and two gangs led from one server rarely meet on it. A job on one server
gets none of these.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

PORT_BASE: Final = 20_000
PORT_SPAN: Final = 30_000


def master_port(user: str, job_id: str, attempt: int, servers: Sequence[str]) -> int:
    digest = hashlib.sha256(f"{user}/{job_id}/{attempt}/{','.join(servers)}".encode()).digest()
    return PORT_BASE + int.from_bytes(digest[:4], "big") % PORT_SPAN


def gang_environment(
    *,
    user: str,
    job_id: str,
    attempt: int,
    servers: Sequence[str],
    node_id: str,
    master_addr: str,
    local_gpus: int,
) -> dict[str, str]:
    """The variables of the part on `node_id` of a job placed on `servers` (in rank order; the
    first one's address is `master_addr`); empty for a job on one server."""
    if len(servers) < 2 or node_id not in servers:
        return {}
    port = str(master_port(user, job_id, attempt, servers))
    rank, nodes = str(servers.index(node_id)), str(len(servers))
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": port,
        "NODE_RANK": rank,
        "NNODES": nodes,
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": port,
        "PET_NODE_RANK": rank,
        "PET_NNODES": nodes,
        "PET_NPROC_PER_NODE": str(local_gpus),
    }
