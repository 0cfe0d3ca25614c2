"""One fake clock: time moves only when the test moves it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

START = datetime(2025, 3, 14, 9, 0, tzinfo=UTC)


class FakeClock:
    """Call it for the time as a datetime (services); `seconds` reads it as a monotonic float."""

    def __init__(self, start: datetime = START) -> None:
        self.start = start
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def seconds(self) -> float:
        """Seconds since the start: for code that takes a `time.monotonic`-like clock."""
        return (self.now - self.start).total_seconds()

    def at(self, seconds: float) -> None:
        """Set the clock to `seconds` after its start."""
        self.now = self.start + timedelta(seconds=seconds)

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
