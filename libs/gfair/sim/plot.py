"""Each user's share of the cluster over time against its entitlement, as a PNG.

Solid lines are the GPU share a user received, dashed lines (same colour) the share it was
entitled to (tickets water-filled by demand among active users), both averaged per time bucket
of the `ShareSeries`. Drawn with matplotlib's Agg canvas directly: no display, no pyplot state.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gfair.sim.ledger import ShareSeries

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
