"""Figures as PNG: each user's share of the cluster over time against its entitlement
(`plot_shares`), and one comparison's figure (`plot_comparison`): the JCT CDFs, each
definition's rho per job sorted, and each policy's user shares over time.

In the shares, solid lines are the GPU share a user received, dashed lines (same colour) the
share it was entitled to (tickets water-filled by demand among active users), both averaged per
time bucket of the `ShareSeries`. Drawn with matplotlib's Agg canvas directly: no display, no
pyplot state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gfair.sim.ledger import ShareSeries

# What `plot_shares` can write, by file suffix (a path without one is written as PNG).
PLOT_FORMATS = frozenset(FigureCanvasAgg.get_supported_filetypes())

# More users than this are drawn as the top ones by GPU time: a legend of 15 colours is noise.
MAX_USERS = 10


def plot_shares(series: ShareSeries, path: str | Path, title: str = "") -> None:
    figure = Figure(figsize=(10, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    received = {user: series.shares(user, series.gpu_s) for user in series.users}
    entitled = {user: series.shares(user, series.entitled_gpu_s) for user in series.users}
    _draw_shares(axes, series.bucket_s, received, entitled, "small")
    axes.set_title(title or "received (solid) vs entitled (dashed) share")
    figure.tight_layout()
    figure.savefig(str(path))


def _draw_shares(
    axes: Axes,
    bucket_s: float,
    received: Mapping[str, Sequence[float]],
    entitled: Mapping[str, Sequence[float]],
    size: str,
    users: Sequence[str] | None = None,
) -> None:
    """`users` (default: the top `MAX_USERS` by GPU time), received solid, entitled dashed;
    a user keeps its colour across panels given the same `users`."""
    if users is None:
        users = _top_users([received])
    length = max((len(values) for values in received.values()), default=0)
    times_h = [index * bucket_s / 3600.0 for index in range(length)]
    for index, user in enumerate(users):
        colour = f"C{index % 10}"
        values = received.get(user, [0.0] * length)
        axes.step(times_h, values, where="post", color=colour, label=user)
        axes.step(
            times_h,
            entitled.get(user, [0.0] * length),
            where="post",
            color=colour,
            linestyle="--",
            linewidth=0.8,
        )
    axes.set_xlabel("time since first submission (h)", fontsize=size)
    axes.set_ylabel("share of cluster GPUs", fontsize=size)
    axes.set_ylim(bottom=0)
    if users:
        axes.legend(loc="upper right", fontsize="x-small", ncol=2)


def _top_users(tables: Sequence[Mapping[str, Sequence[float]]]) -> list[str]:
    totals: dict[str, float] = {}
    for table in tables:
        for user, values in table.items():
            totals[user] = totals.get(user, 0.0) + sum(values)
    return sorted(totals, key=lambda user: (-totals[user], user))[:MAX_USERS]


def plot_comparison(
    jcts: Mapping[str, Sequence[float]],
    rhos: Mapping[str, Mapping[str, Sequence[float]]],
    shares: Mapping[str, Mapping[str, Any] | None],
    path: str | Path,
    title: str = "",
) -> None:
    """One workload under several policies: the JCT CDF, each rho definition's values per
    job sorted (`rhos`: definition -> policy -> values), and per policy each user's received
    (solid) and entitled (dashed) share over time (`shares`: policy -> SharesOverTime JSON)."""
    policies = list(jcts)
    colours = {policy: f"C{index % 10}" for index, policy in enumerate(policies)}
    columns = 1 + len(rhos)
    share_rows = math.ceil(len(policies) / columns)
    figure = Figure(figsize=(4.0 * columns, 3.0 * (1 + share_rows)), dpi=80)
    FigureCanvasAgg(figure)
    users = _top_users([series["received"] for series in shares.values() if series is not None])
    cdf = figure.add_subplot(1 + share_rows, columns, 1)
    for policy, values in jcts.items():
        ordered = sorted(jct / 3600.0 for jct in values if jct > 0)
        fractions = [(rank + 1) / len(ordered) for rank in range(len(ordered))]
        cdf.step(ordered, fractions, where="post", color=colours[policy], label=policy)
    cdf.set_xscale("log")
    cdf.set_ylim(0, 1)
    cdf.set_xlabel("JCT (h)", fontsize="small")
    cdf.set_ylabel("fraction of jobs", fontsize="small")
    cdf.set_title("JCT CDF", fontsize="small")
    cdf.legend(fontsize="x-small")
    for index, (definition, by_policy) in enumerate(rhos.items()):
        axes = figure.add_subplot(1 + share_rows, columns, 2 + index)
        for policy, values in by_policy.items():
            ordered = sorted(values)
            axes.plot(range(1, len(ordered) + 1), ordered, color=colours[policy], label=policy)
        axes.axhline(1.0, color="grey", linewidth=0.6, linestyle=":")
        axes.set_yscale("log")
        axes.set_xlabel("jobs, sorted by rho", fontsize="small")
        axes.set_title(f"rho, {definition.replace('_', '-')}", fontsize="small")
    for index, policy in enumerate(policies):
        axes = figure.add_subplot(1 + share_rows, columns, 1 + columns + index)
        series = shares.get(policy)
        if series is not None:
            _draw_shares(
                axes,
                series["bucket_s"],
                series["received"],
                series["entitled"],
                "x-small",
                users,
            )
        axes.set_title(f"{policy}: received vs entitled share", fontsize="small")
    for axes in figure.axes:
        axes.tick_params(labelsize="x-small")
    if title:
        figure.suptitle(title, fontsize="medium")
    figure.tight_layout()
    figure.savefig(str(path))
