"""Entry point of the `gfair` command: one argparse tree, one module per subcommand.

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func` (a callable taking the parsed namespace and returning an exit code).

Importing a subcommand module costs up to seconds (pydantic, nats, matplotlib, the simulator),
so this module imports nothing heavy and only the module of the command being run: the others
appear in the tree as stubs carrying the help line of `COMMANDS`, which is all ``gfair --help``
shows (tests/cli/test_main.py checks the table against the real parsers).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

# Each subcommand: the module under gfair.cli that registers it and its help line, in help order.
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("simulate", "replay a job trace on a simulated cluster"),
    "compare": ("compare", "compare scheduling policies on several simulated workloads"),
    "replay": ("replay", "replay a scheduler journal; exit 1 at the first output that differs"),
    "schemas": ("schemas", "regenerate (or --check) the JSON Schemas of the event contract"),
    "service": ("service", "run one gfair service (placement, split-stride, node-executor, ...)"),
    "up": ("up", "run a whole gfair cluster on this machine (simulated GPUs, or its own)"),
    "submit": ("submit", "submit a job"),
    "cancel": ("cancel", "cancel a job"),
    "wait": ("wait", "wait until a job ends; exit with its outcome"),
    "jobs": ("jobs", "list jobs"),
    "job": ("jobs", "show one job"),
    "users": ("users", "users' shares: entitled vs received"),
    "shares": ("shares", "accounts in a tree: tickets, entitled and received share"),
    "history": ("history", "jobs with their wait, run time and GPU-hours (sacct)"),
    "usage": ("usage", "GPU-hours per user over windows, and decayed (sshare)"),
    "nodes": ("nodes", "list nodes, or uncordon one"),
    "top": ("top", "live view: shares, servers, trades"),
    "why": ("why", "explain why a job waits"),
    "logs": ("logs", "a job's stdout and stderr"),
    "trace": ("trace", "show a job's life as one distributed trace"),
    "trace-convert": (
        "trace_convert",
        "convert a Gavel or Philly trace to gfair's CSV (also: gfair trace convert)",
    ),
    "demo": ("demo", "run a cluster and a multi-user workload for a few minutes, live"),
    "tenants": (
        "tenants",
        "render (or --check) the NATS authorization of the tenants file (tenants, nodes)",
    ),
    "completion": ("completion", "print a shell completion script (bash or zsh)"),
}

# What a shell reports when a process dies of SIGPIPE (128 + 13), as `yes | head` does.
EXIT_BROKEN_PIPE = 141


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version("gfair")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from gfair import __version__

        return __version__


class _VersionAction(argparse.Action):
    """`--version`, resolving the version only when asked (package metadata is slow to read)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"gfair {version()}")
        parser.exit()


def build_parser(command: str | None = None, *, complete: bool = False) -> argparse.ArgumentParser:
    """The argparse tree: the real parser of `command` (every one when `complete`), stubs else."""
    parser = argparse.ArgumentParser(
        prog="gfair",
        description="Fair-share scheduler for multi-tenant, heterogeneous GPU clusters.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    registered: set[str] = set()
    for name, (module_name, help_line) in COMMANDS.items():
        if complete or (command is not None and COMMANDS.get(command, ("",))[0] == module_name):
            if module_name not in registered:
                registered.add(module_name)
                importlib.import_module(f"gfair.cli.{module_name}").register(subparsers)
        else:
            subparsers.add_parser(name, help=help_line, add_help=False)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: the first word that is not an option."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `gfair trace JOB` takes any job id, so `gfair trace convert` is its own command.
    if argv[:2] == ["trace", "convert"]:
        argv[:2] = ["trace-convert"]
    try:
        try:
            parser = build_parser(chosen_command(argv))
            args = parser.parse_args(argv)
            code: int = args.func(args)
        finally:
            # Output still buffered (`--help` too) must fail here, where a closed pipe is
            # handled, not at interpreter exit.
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()
    return code


def _reader_gone() -> int:
    """The reader of stdout left (`gfair jobs --json | head`): stop quietly, like `cat` does.

    Python would otherwise print a traceback, and again at exit when it flushes stdout; pointing
    stdout at /dev/null makes that last flush succeed.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
