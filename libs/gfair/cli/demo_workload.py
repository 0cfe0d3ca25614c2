"""The workload `gfair demo` submits: four teams whose jobs gain very differently from a V100.

Speedups of V100 over K80 are the Gavel measurements (`data/gavel_throughputs.json`):

| user   | job type                         | V100/K80 | tickets | jobs                    |
|--------|----------------------------------|----------|---------|-------------------------|
| vision | ResNet-50 (batch size 32)        | 6.3x     | 1       | 5 x 1 GPU, +2 later     |
| nlp    | LM (batch size 5)                | 4.3x     | 2       | 4 x 1 GPU, 1 x 4-GPU gang |
| rl     | A3C                              | 2.1x     | 1       | 4 x 1 GPU, +1 later     |
| recsys | Recommendation (batch size 8192) | 1.05x    | 2       | 8 x 1 GPU               |

Every team asks for more GPUs than its ticket share, so shares are decided by tickets, and the
trading auction has something to trade: vision buys V100 share from recsys, which gains almost
nothing from a V100 and is paid in more K80 share than it gives. The gang's type differs from
nlp's other jobs because the profiler pools per-GPU rates per job type, and a 4-GPU gang of a
type scales differently from one GPU of it.

Jobs are the synthetic training job (`python -m gfair.sdk.synthetic`), whose speed on each
generation is the measured one; their lengths scale with the demo's duration, so that some end
within it and the rest keep the cluster contended to the end.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class DemoJob:
    user: str
    name: str
    job_type: str
    gpus: int
    # Seconds of training on one V100 gang, as a fraction of the demo's duration.
    work: float
    # When it is submitted, as a fraction of the demo's duration.
    at: float = 0.0

    def command(self, duration_s: float, python: str = sys.executable) -> list[str]:
        return [
            python,
            "-m",
            "gfair.sdk.synthetic",
            "--job-type",
            self.job_type,
            "--duration-s",
            f"{max(self.work * duration_s, 1.0):.1f}",
            "--checkpoint-every",
            "200",
        ]


@dataclass(frozen=True)
class DemoUser:
    name: str
    tickets: float
    job_type: str
    speedup: str  # what it gains from a V100, for the screen


RESNET50 = "ResNet-50 (batch size 32)"
LM5 = "LM (batch size 5)"
LM20 = "LM (batch size 20)"
A3C = "A3C"
RECSYS = "Recommendation (batch size 8192)"

USERS: tuple[DemoUser, ...] = (
    DemoUser("vision", 1.0, RESNET50, "6.3x"),
    DemoUser("nlp", 2.0, LM5, "4.3x"),
    DemoUser("rl", 1.0, A3C, "2.1x"),
    DemoUser("recsys", 2.0, RECSYS, "1.05x"),
)


def _jobs() -> tuple[DemoJob, ...]:
    jobs: list[DemoJob] = []
    # Lengths (V100 time) from a tenth of the demo to more than all of it: with every user
    # getting a fraction of a GPU per job, the short ones finish and free GPUs, the long ones
    # keep every user asking for more than its share to the end.
    spread = (0.1, 0.5, 0.8, 0.2, 1.0, 0.6, 1.2, 0.3)
    for count, user in ((5, "vision"), (4, "nlp"), (4, "rl"), (8, "recsys")):
        job_type = next(u.job_type for u in USERS if u.name == user)
        jobs += [
            DemoJob(user, f"{user}-{i}", job_type, 1, spread[i % len(spread)]) for i in range(count)
        ]
    jobs.append(DemoJob("nlp", "nlp-gang", LM20, 4, 0.5))
    # Arrivals later on: shares are recomputed, jobs placed where their users have room.
    jobs += [
        DemoJob("vision", "vision-late-0", RESNET50, 1, 0.3, at=0.35),
        DemoJob("vision", "vision-late-1", RESNET50, 1, 0.6, at=0.35),
        DemoJob("rl", "rl-late-0", A3C, 1, 0.4, at=0.4),
    ]
    return tuple(jobs)


JOBS: tuple[DemoJob, ...] = _jobs()


def user_tickets() -> dict[str, float]:
    return {user.name: user.tickets for user in USERS}


def tickets_setting() -> str:
    """The users' tickets as `GFAIR_USER_TICKETS` takes them."""
    return ",".join(f"{user.name}={user.tickets:g}" for user in USERS)
