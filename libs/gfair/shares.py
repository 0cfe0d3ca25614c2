"""Reading a shares file (docs/configuration.md, "Shares file"): the one place that does the I/O
for the simulator, the CLI and the services; the parsing is the core's (`shares_file`)."""

from __future__ import annotations

from pathlib import Path

from gfair.core.shares_file import SharesFileError, parse_shares
from gfair.core.shares_tree import ShareTree


def read_shares(path: Path | str) -> ShareTree:
    """The tree in the file at `path`, or `SharesFileError` saying why not."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SharesFileError(f"shares file {path}: cannot read it ({error})") from None
    return parse_shares(text, str(path))
