"""The options of `gfair simulate` and `gfair compare` that price a switch
(`gfair.core.switch_costs`): what a job loses resuming where it left, and starting on other
servers. The decision kernel weighs every move against them."""

from __future__ import annotations

import argparse
import math

from gfair.core.switch_costs import DEFAULT_COSTS, SwitchCosts


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return value


def add_switch_cost_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--switch-cost",
        type=_seconds,
        default=DEFAULT_COSTS.resume_s,
        metavar="SECONDS",
        help=f"progress a job loses resuming in place (default {DEFAULT_COSTS.resume_s:g})",
    )
    parser.add_argument(
        "--migration-cost",
        type=_seconds,
        default=DEFAULT_COSTS.migration_s,
        metavar="SECONDS",
        help="progress a job loses starting on other servers "
        f"(default {DEFAULT_COSTS.migration_s:g})",
    )


def switch_costs(args: argparse.Namespace) -> SwitchCosts:
    return SwitchCosts(resume_s=args.switch_cost, migration_s=args.migration_cost)
