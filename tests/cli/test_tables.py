"""What people read at 80 columns: no header or value cut, free text whole, numbers rounded."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from rich.console import Console

from gfair.bus.history import HistoricalEvent
from gfair.cli.history import history_table
from gfair.cli.jobs import _summary, events_table
from gfair.cli.output import seconds, users_table
from gfair.client.views import JobDetails, PoolUsage, UserSummary, UsersView
from gfair.events.envelope import Envelope
from gfair.events.jobs import JobExited, JobSuspended
from gfair.events.reasons import SuspendReason
from gfair.events.states import JobState
from gfair.state.profile_record import JobProfileRecord, SwitchEstimate, SwitchSamples
from gfair.state.usage import HistoryLine

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
REASON = "asks for 512 GPUs; it can never fit: the largest pool has 256 GPUs on 32 servers"


def render(renderable: object, width: int = 80) -> str:
    console = Console(width=width, record=True, force_terminal=False)
    console.print(renderable)
    return console.export_text()


def _line(job_id: str, reason: str | None, *, held_s: float, wall_s: float) -> HistoryLine:
    started = NOW - timedelta(seconds=wall_s + 5)
    return HistoryLine(
        user="alice",
        job_id=job_id,
        state=JobState.FAILED,
        gpus=2,
        generation="v100",
        submitted_at=started - timedelta(seconds=30),
        started_at=started,
        ended_at=started + timedelta(seconds=wall_s),
        gpu_hours={"v100": 2 * held_s / 3600},
        reason=reason,
    )


def test_history_keeps_every_word_and_tells_held_from_wall_time_at_80_columns() -> None:
    # Ran 0.2 s over three attempts spread across 11 s of back-off.
    lines = [_line("resnet-64735357c555", REASON, held_s=0.2, wall_s=11.0)]
    text = render(history_table(lines, NOW, 80))
    assert "…" not in text
    assert all(len(row) <= 80 for row in text.splitlines())
    for header in ("job", "state", "gpus", "held", "wall", "GPU-h"):
        assert f" {header}" in f" {text}"
    joined = " ".join(text.split())  # the terminal may wrap the reason between words
    assert f"alice/resnet-64735357c555: {REASON}" in joined
    row = next(r for r in text.splitlines() if r.startswith("alice/resnet"))
    assert "0.2s" in row and "11.0s" in row


def test_a_wide_terminal_shows_every_column_and_a_narrow_one_says_what_it_left_out() -> None:
    lines = [_line("a-rather-long-job-name-0123456789ab", None, held_s=100.0, wall_s=4000.0)]
    wide = render(history_table(lines, NOW, 160), 160)
    assert "submitted" in wide and "waited" in wide and "left out" not in wide
    narrow = render(history_table(lines, NOW, 80))
    assert "left out to fit: submitted" in narrow and "…" not in narrow


def test_durations_are_short_and_rounded() -> None:
    assert [seconds(s) for s in (0.10230384300029982, 11.04, 245, 6300, 183600)] == [
        "0.1s",
        "11.0s",
        "4m05s",
        "1h45m",
        "2d03h",
    ]
    assert seconds(None) == "-"


def test_job_events_keep_a_path_whole_and_round_measurements_at_80_columns() -> None:
    path = "gfair-work/runs/alice/resnet-64735357c555/attempt-3/stderr-of-the-job.log"
    exited = JobExited(
        user="alice",
        job_id="resnet-64735357c555",
        node_id="v100-0",
        attempt=3,
        exit_code=1,
        runtime_s=0.10230384300029982,
        stderr_tail=f"Traceback: see {path}",
    )
    event = HistoricalEvent(
        stream="GFAIR_JOBS",
        sequence=12,
        envelope=Envelope.wrap(exited, source="node-executor/v100-0"),
        data=exited,
    )
    text = render(events_table([event]))
    assert all(len(row) <= 80 for row in text.splitlines())
    assert "…" not in text
    assert "runtime_s=0.102" in text and "0.1023038" not in text
    assert path in "".join(text.split())  # folded onto lines, not cut


def test_users_at_80_columns_keep_the_totals_and_say_what_was_left_out() -> None:
    pools = {
        generation: PoolUsage(generation, fair=1.5, entitled=2.25, gpu_seconds=0.0, received=1.75)
        for generation in ("v100", "p100", "k80")
    }
    view = UsersView(
        users=[UserSummary(user="alice", tickets=2, jobs=3, demand=6, pools=pools)],
        capacity={"v100": 8, "p100": 8, "k80": 16},
    )
    narrow = render(users_table(view, 80))
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert "…" not in narrow and "left out to fit: " in narrow
    assert "6.75" in narrow and "5.25" in narrow  # entitled and received, summed over pools
    wide = render(users_table(view, 160), 160)
    assert "1.50/2.25/1.75" in wide and "left out" not in wide


def test_a_jobs_summary_shows_what_the_scheduler_charges_beside_what_was_measured() -> None:
    suspend = JobSuspended(
        user="alice",
        job_id="train",
        node_id="n1",
        attempt=1,
        reason=SuspendReason.TIME_SLICE,
        duration_s=0.4,
        in_place=True,
    )
    events = (HistoricalEvent("GFAIR_JOBS", 1, Envelope.wrap(suspend, source="node"), suspend),)
    estimate = SwitchEstimate(reports=3, yield_s=0.5, cold_start_s=30.0, at=NOW)
    profile = JobProfileRecord(
        user="alice",
        job_id="train",
        gpus=1,
        switches=SwitchSamples(yields=(0.5,), cold_starts=(30.0,), reports=3, published=estimate),
        updated_at=NOW,
    )
    text = render(_summary(JobDetails("alice", "train", None, events, profile)))
    joined = " ".join(text.split())
    assert "switches 1 suspends (1 in place), yield p50 0.400s" in joined
    assert "estimated yield 0.500s, cold start 30.00s (from 3 reports)" in joined
    assert "charged resume 30.50s from its checkpoint; move 30.50s" in joined


def test_users_show_their_accounts_only_with_a_shares_file_that_places_someone() -> None:
    pools = {"v100": PoolUsage("v100", fair=1.0, entitled=1.0, gpu_seconds=0.0, received=1.0)}
    placed = [
        UserSummary(user="alice", tickets=1, jobs=1, demand=1, pools=pools, account="lab/vision"),
        UserSummary(user="eve", tickets=1, jobs=1, demand=1, pools=pools),
    ]
    with_tree = render(users_table(UsersView(users=placed, capacity={"v100": 4}), 120), 120)
    assert "account" in with_tree and "lab/vision" in with_tree
    flat = [replace(u, account="") for u in placed]
    without = render(users_table(UsersView(users=flat, capacity={"v100": 4}), 120), 120)
    assert "account" not in without
