"""A job whose start-up is CPU work (an import's, a checkpoint's load) and which is not opted in
to prepared starts (stdlib only, run by the time-slicing tests): it comes up, then trains,
parking in place when asked.

    python slow_start_job.py START_UP_CPU_SECONDS STEPS STEP_SECONDS
"""

from __future__ import annotations

import sys
import time

from gfair.sdk import Job


def main() -> int:
    start_up, steps, pause = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    while time.process_time() < start_up:
        pass
    job = Job.from_env()
    state = job.load_checkpoint() or {"step": 0}
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
