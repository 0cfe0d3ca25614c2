"""Figures as PNG: each user's share of the cluster over time against its entitlement
(`plot_shares`), and the JCT distributions of several policies per workload (`plot_jct_cdfs`).

In the shares, solid lines are the GPU share a user received, dashed lines (same colour) the
share it was entitled to (tickets water-filled by demand among active users), both averaged per
time bucket of the `ShareSeries`. Drawn with matplotlib's Agg canvas directly: no display, no
pyplot state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gfair.sim.ledger import ShareSeries

# What `plot_shares` can write, by file suffix (a path without one is written as PNG).
PLOT_FORMATS = frozenset(FigureCanvasAgg.get_supported_filetypes())

# More users than this are drawn as the top ones by GPU time: a legend of 15 colours is noise.
MAX_USERS = 10


def plot_shares(series: ShareSeries, path: str | Path, title: str = "") -> None:
    times_h = [(t - series.start) / 3600.0 for t in series.times()]
    totals = {user: sum(series.gpu_s.get(user, [])) for user in series.users}
    users = sorted(totals, key=lambda user: (-totals[user], user))[:MAX_USERS]
    figure = Figure(figsize=(10, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    colours = [f"C{index % 10}" for index in range(len(users))]
    for user, colour in zip(users, colours, strict=True):
        axes.step(
            times_h, series.shares(user, series.gpu_s), where="post", color=colour, label=user
        )
        axes.step(
            times_h,
            series.shares(user, series.entitled_gpu_s),
            where="post",
            color=colour,
            linestyle="--",
            linewidth=0.8,
        )
    axes.set_xlabel("time since first submission (h)")
    axes.set_ylabel("share of cluster GPUs")
    axes.set_ylim(bottom=0)
    axes.set_title(title or "received (solid) vs entitled (dashed) share")
    if users:
        axes.legend(loc="upper right", fontsize="small", ncol=2)
    figure.tight_layout()
    figure.savefig(str(path))


def plot_jct_cdfs(
    curves: Mapping[str, Mapping[str, Sequence[float]]], path: str | Path, title: str = ""
) -> None:
    """One panel per workload, one CDF of job completion times (hours, log scale) per policy.

    `curves` maps a workload to a policy to the completed jobs' JCTs in seconds; policies keep
    one colour across panels.
    """
    names = list(curves)
    policies = list(dict.fromkeys(policy for by in curves.values() for policy in by))
    colours = {policy: f"C{index % 10}" for index, policy in enumerate(policies)}
    columns = min(4, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / columns))
    figure = Figure(figsize=(4.2 * columns, 3.2 * rows), dpi=100)
    FigureCanvasAgg(figure)
    for index, name in enumerate(names):
        axes = figure.add_subplot(rows, columns, index + 1)
        for policy, jcts in curves[name].items():
            ordered = sorted(jct / 3600.0 for jct in jcts if jct > 0)
            if not ordered:
                continue
            fractions = [(rank + 1) / len(ordered) for rank in range(len(ordered))]
            axes.step(ordered, fractions, where="post", color=colours[policy], label=policy)
        axes.set_xscale("log")
        axes.set_ylim(0, 1)
        axes.set_title(name, fontsize="small")
        axes.tick_params(labelsize="x-small")
        axes.grid(True, which="major", linewidth=0.3)
        if index % columns == 0:
            axes.set_ylabel("fraction of jobs", fontsize="small")
        if index >= len(names) - columns:
            axes.set_xlabel("JCT (h)", fontsize="small")
    handles = [Line2D([], [], color=colours[policy], label=policy) for policy in policies]
    # Title on top, the legend under it, the panels below both.
    top = 1.0 - 0.9 / figure.get_figheight()
    if title:
        figure.suptitle(title, y=1.0 - 0.15 / figure.get_figheight(), fontsize="medium")
    if handles:
        figure.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, 1.0 - 0.45 / figure.get_figheight()),
            ncol=len(handles),
            fontsize="small",
        )
    figure.tight_layout(rect=(0, 0, 1, top))
    figure.savefig(str(path))
