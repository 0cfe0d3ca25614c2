"""`gfair nodes`: the servers, their GPUs and health; `gfair nodes uncordon NODE`.

`--json` prints the node records (`gfair.state.node_record.NodeRecord`); uncordon prints
``{"node_id", "event_id"}``.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from gfair.cli import output, session
from gfair.cli.arguments import add_command
from gfair.client import GfairClient
from gfair.events.states import NodeState

_STATE_STYLES = {
    NodeState.READY: "green",
    NodeState.SUSPECTED: "yellow",
    NodeState.FAILED: "bold red",
    NodeState.QUARANTINED: "red",
}


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "nodes", __doc__)
    session.add_connection_flags(parser)
    parser.set_defaults(func=lambda args: session.run(args, _nodes))
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    uncordon = actions.add_parser("uncordon", help="clear a node's quarantine")
    uncordon.add_argument("node", metavar="NODE")
    uncordon.add_argument("--reason", help="why (kept with the node)")
    session.add_connection_flags(uncordon, nested=True)
    uncordon.set_defaults(func=lambda args: session.run(args, _uncordon))


async def _nodes(client: GfairClient, args: argparse.Namespace) -> int:
    nodes = await client.nodes()
    if args.json:
        output.print_json([n.model_dump(mode="json") for n in nodes])
        return session.EXIT_OK
    table = Table(title=f"{len(nodes)} node(s)")
    for column in ("node", "state", "GPUs", "generation", "running", "failures", "reason"):
        table.add_column(column)
    for n in nodes:
        style = _STATE_STYLES.get(n.state, "")
        state = f"[{style}]{n.state}[/]" if style else str(n.state)
        if n.quarantined and n.state is not NodeState.QUARANTINED:
            state += " [red](quarantined)[/]"
        table.add_row(
            n.node_id,
            state,
            str(n.gpu_count),
            ",".join(sorted(n.generations)) or "-",
            ", ".join(str(j) for j in n.running) or "-",
            str(len(n.recent_failures)),
            n.quarantine_reason or n.reason or "",
        )
    output.console().print(table)
    return session.EXIT_OK


async def _uncordon(client: GfairClient, args: argparse.Namespace) -> int:
    envelope = await client.uncordon(args.node, reason=args.reason)
    if args.json:
        output.print_json({"node_id": args.node, "event_id": envelope.id})
    else:
        output.console().print(f"uncordon of {args.node} requested")
    return session.EXIT_OK
