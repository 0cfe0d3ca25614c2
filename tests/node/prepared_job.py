"""A job that may be submitted with `prepare` (stdlib only, run by the executor tests): it
"imports its framework" (sleeping, or with `cpu` working: CPU seconds, as a real import's), then
calls `Job.from_env()` before it touches a GPU, and prints which GPUs it saw before and after
that call; then it trains, parking in place when asked.

    python prepared_job.py IMPORT_SECONDS STEPS STEP_SECONDS [cpu]
"""

from __future__ import annotations

import os
import sys
import time

from gfair.sdk import Job


def main() -> int:
    importing, steps, pause = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if sys.argv[4:] == ["cpu"]:
        while time.process_time() < importing:
            pass
    else:
        time.sleep(importing)
    job = Job.from_env()
    after = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(f"visible before={before!r} after={after!r}", flush=True)
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
