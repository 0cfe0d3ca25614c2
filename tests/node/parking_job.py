"""A training loop that parks in place when asked (stdlib only, run by the supervisor tests).

Its "device state" is a counter that must be on the host exactly while it is parked: `offload`
and `restore` check and flip it, and count themselves into the checkpoint's state.

    python parking_job.py STEPS STEP_SECONDS
"""

from __future__ import annotations

import sys
import time

from gfair.sdk import Job


def main() -> int:
    steps, pause = int(sys.argv[1]), float(sys.argv[2])
    job = Job.from_env()
    state = job.load_checkpoint() or {"step": 0, "offloads": 0, "restores": 0}
    where = {"device": "gpu"}

    def offload() -> None:
        assert where["device"] == "gpu"
        where["device"] = "host"
        state["offloads"] += 1

    def restore() -> None:
        assert where["device"] == "host"
        where["device"] = "gpu"
        state["restores"] += 1

    job.register_state(offload, restore)
    for step in range(state["step"], steps):
        time.sleep(pause)
        state["step"] = step + 1
        job.report(step)
        if job.should_yield():
            job.suspend(lambda: job.save_checkpoint(dict(state)))
    job.save_checkpoint(dict(state))
    job.complete()
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
