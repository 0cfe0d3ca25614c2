"""The per-quantum timeline: one JSON line per quantum per busy server.

``{"t": 120.0, "server": "v100-3", "generation": "v100", "running": ["17", "42"]}``

``t`` is the quantum's start (virtual seconds on the trace's clock), ``running`` the jobs
holding GPUs on that server at the start of the quantum, in the policy's order. Servers running
nothing are left out, and so are the idle stretches the simulator skips, so an absent line means
an idle server. Quanta the simulator jumps over without a decision (run-to-completion policies)
are written all the same, from the decision in force: the file does not depend on how the clock
was advanced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO

from gfair.core.cluster import Cluster


class TimelineWriter:
    """A `TimelineSink` writing JSON lines to an open text stream (the caller closes it)."""

    def __init__(self, stream: IO[str], cluster: Cluster) -> None:
        self._stream = stream
        # Pre-encoded per-server prefixes: the timeline can run to millions of lines.
        self._prefix = {
            server.id: (
                f'"server": {json.dumps(server.id)}, '
                f'"generation": {json.dumps(server.generation)}, "running": '
            )
            for server in cluster.servers
        }
        self.lines = 0

    def quantum(self, now: float, runs: Mapping[str, list[str]]) -> None:
        write = self._stream.write
        stamp = json.dumps(float(now))
        for server, jobs in runs.items():
            if jobs:
                write(f'{{"t": {stamp}, {self._prefix[server]}{json.dumps(jobs)}}}\n')
                self.lines += 1
