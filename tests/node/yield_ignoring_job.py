"""A hostile job (run by the yield tests): it trains a few mini-batches, so it came up, then
ignores its yields (SIGUSR1, the SDK's) and SIGTERM; only SIGKILL stops it."""

from __future__ import annotations

import signal
import time

from gfair.sdk import Job

job = Job.from_env()
for step in range(10):
    time.sleep(0.05)
    job.report(step)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(600)  # pause under test: it hangs on, whatever it is told
