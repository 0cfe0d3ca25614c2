"""`gfair logs JOB [-f]`: what a job wrote to stdout and stderr, from every node it ran on.

    gfair logs alice/resnet-3f9c2a -f

The node executors ship each run's output into the ``GFAIR_LOGS`` stream (bounded retention,
`GFAIR_LOGS_MAX_AGE_S` and `GFAIR_LOGS_MAX_BYTES`), so the output outlives the node and its
container. Chunks print in the order they were stored, stdout and stderr together (`--output`
picks one), each run under a line naming it, ``==> node v100-0, run-0002 <==`` (as `tail` marks
files; a run is one start or resume of the job on a node; `--no-headers` leaves them out).
`-f` then prints new output as it comes, until the job has ended and its last runs' output is
in. `--json` prints NDJSON, one chunk a line: ``{"sequence", "output",
"node", "run", "offset", "text"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from gfair.bus.job_output import OUTPUTS, OutputChunk
from gfair.cli import output, session
from gfair.cli.arguments import add_command
from gfair.client import GfairClient, UnknownJob

# How often -f looks for new output; the executors ship every second.
POLL_S = 0.5
# After the job ended: at least this long for its last output to be shipped, at most the other.
SETTLE_S, GIVE_UP_S = 2.0, 15.0


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "logs", __doc__)
    session.add_job_argument(parser)
    parser.add_argument(
        "-f", "--follow", action="store_true", help="then print new output until the job ends"
    )
    parser.add_argument("--output", choices=OUTPUTS, help="only this one (default: both)")
    parser.add_argument(
        "--no-headers",
        action="store_true",
        help="no line naming the node and run before each run's output",
    )
    session.add_connection_flags(parser)
    parser.set_defaults(func=lambda args: session.run(args, _logs))


async def _logs(client: GfairClient, args: argparse.Namespace) -> int:
    user, job_id = args.ref
    show = _Printer(args.output, as_json=args.json, headers=not args.no_headers)
    after = await _print_stored(client, user, job_id, show, start=1)
    if show.chunks == 0:
        await client.job(user, job_id, with_events=False)  # UnknownJob: say so
    if not args.follow:
        return session.EXIT_OK
    ended_at: float | None = None
    while True:
        if ended_at is None:
            try:
                state = (await client.job(user, job_id, with_events=False)).state
            except UnknownJob:  # submitted, not yet taken in
                state = None
            if state is not None and state.terminal:
                ended_at = time.monotonic()
        after = await _print_stored(client, user, job_id, show, start=after)
        if ended_at is not None:
            waited = time.monotonic() - ended_at
            if (waited >= SETTLE_S and show.all_runs_ended()) or waited >= GIVE_UP_S:
                return session.EXIT_OK
        await asyncio.sleep(POLL_S)


async def _print_stored(
    client: GfairClient, user: str, job_id: str, show: _Printer, *, start: int
) -> int:
    """Print what is stored from `start` on; the sequence to read from next."""
    async for chunk in client.output(user, job_id, start=start):
        show(chunk)
        start = chunk.sequence + 1
    return start


class _Printer:
    def __init__(self, only: str | None, *, as_json: bool, headers: bool = True) -> None:
        self._only = only
        self._json = as_json
        self._headers = headers and not as_json
        self._shown: tuple[str, str] | None = None  # the run whose output printed last
        self.chunks = 0
        # (node, run) -> outputs whose end was seen
        self._runs: dict[tuple[str, str], set[str]] = {}

    def __call__(self, chunk: OutputChunk) -> None:
        self.chunks += 1
        ended = self._runs.setdefault((chunk.node, chunk.run), set())
        if chunk.end:
            ended.add(chunk.output)
            return
        if self._only is not None and chunk.output != self._only:
            return
        if self._json:
            output.print_json_line(
                {
                    "sequence": chunk.sequence,
                    "output": chunk.output,
                    "node": chunk.node,
                    "run": chunk.run,
                    "offset": chunk.offset,
                    "text": chunk.data.decode(errors="replace"),
                }
            )
            return
        sys.stdout.flush()  # what was printed as text goes first
        if self._headers and self._shown != (chunk.node, chunk.run):
            # Runs interleave (a resume elsewhere, a retry): each switch is marked.
            self._shown = (chunk.node, chunk.run)
            sys.stdout.write(f"==> node {chunk.node}, {chunk.run} <==\n")
            sys.stdout.flush()
        sys.stdout.buffer.write(chunk.data)
        sys.stdout.flush()

    def all_runs_ended(self) -> bool:
        return all(ended >= set(OUTPUTS) for ended in self._runs.values())
