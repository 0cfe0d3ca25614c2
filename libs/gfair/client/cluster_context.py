"""Finding a local cluster without setup: the context files a running `gfair up` leaves behind.

`gfair up` writes ``<data-dir>/context.json`` and a per-user file of its own,
``$XDG_STATE_HOME/gfair/clusters/<pid>.json`` (by default under ``~/.local/state``), once its
cluster is ready, and removes both when it stops, so that ``gfair submit`` in another terminal
reaches it the way ``ray job submit`` reaches ``ray start --head``. One file per `gfair up`:
when two run and one stops, the other's file stays, and tools go on finding it. A file whose
process is gone (the owner was killed) describes nothing and is ignored.

Where a tool looks for NATS, first match wins:

1. an explicit URL (``--nats``, or `servers` given to the client);
2. ``$GFAIR_NATS_URL``;
3. the context of a running `gfair up`: ``./.gfair/context.json`` (the default data dir of a
   `gfair up` started here), then the per-user files, the latest written first (then the single
   ``gfair/context.json`` an older gfair wrote);
4. ``nats://127.0.0.1:4222``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
NATS_URL_ENV = "GFAIR_NATS_URL"
CREDS_ENV = "GFAIR_NATS_CREDS"
CONTEXT_FILE = "context.json"
# The per-user folder holding one context file per running `gfair up`, named by its pid.
USER_CONTEXTS = "clusters"
DEFAULT_DATA_DIR = Path(".gfair")
CONTEXT_VERSION = 1


class ContextError(ValueError):
    """A context file that cannot be read as one (malformed, or from a newer gfair)."""


@dataclass(frozen=True)
class ClusterContext:
    """What a client needs to reach one running `gfair up`, and how to tell it is still up."""

    nats_url: str
    pid: int
    # The owner's start time as the kernel counts it (Linux), so that a pid reused by an
    # unrelated process after the owner died does not pass for the owner.
    pid_started: int | None = None
    data_dir: str | None = None
    creds: str | None = None
    span_file: str | None = None
    started_at: str | None = None
    # Where it was read from; not part of the file.
    path: Path | None = field(default=None, compare=False)

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(url.strip() for url in self.nats_url.split(",") if url.strip())

    @property
    def running(self) -> bool:
        return process_running(self.pid, self.pid_started)

    def to_json(self) -> str:
        document = {
            "version": CONTEXT_VERSION,
            "nats_url": self.nats_url,
            "pid": self.pid,
            "pid_started": self.pid_started,
            "data_dir": self.data_dir,
            "creds": self.creds,
            "span_file": self.span_file,
            "started_at": self.started_at,
        }
        return json.dumps(document, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, path: Path | None = None) -> ClusterContext:
        where = str(path) if path is not None else "context"
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ContextError(f"{where}: not JSON ({exc})") from None
        if not isinstance(document, dict):
            raise ContextError(f"{where}: expected a JSON object")
        version = document.get("version")
        if version != CONTEXT_VERSION:
            raise ContextError(f"{where}: version {version!r}, this gfair reads {CONTEXT_VERSION}")
        url, pid = document.get("nats_url"), document.get("pid")
        if not isinstance(url, str) or not url.strip():
            raise ContextError(f"{where}: nats_url must be a non-empty string")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise ContextError(f"{where}: pid must be a positive integer")
        started = document.get("pid_started")
        return cls(
            nats_url=url,
            pid=pid,
            pid_started=started if isinstance(started, int) else None,
            data_dir=_text(document, "data_dir", where),
            creds=_text(document, "creds", where),
            span_file=_text(document, "span_file", where),
            started_at=_text(document, "started_at", where),
            path=path,
        )


def _text(document: Mapping[str, object], key: str, where: str) -> str | None:
    value = document.get(key)
    if value is None or isinstance(value, str):
        return value
    raise ContextError(f"{where}: {key} must be a string or null")


def user_state_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """``$XDG_STATE_HOME/gfair`` (default ``~/.local/state/gfair``); None without a home."""
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    if state and Path(state).is_absolute():
        return Path(state) / "gfair"
    home = env.get("HOME") or None
    if home is None:
        try:
            home = str(Path.home())
        except RuntimeError:
            return None
    return Path(home) / ".local" / "state" / "gfair"


def user_context_path(
    environ: Mapping[str, str] | None = None, pid: int | None = None
) -> Path | None:
    """The per-user context file of the `gfair up` with `pid` (default: this process)."""
    state = user_state_dir(environ)
    if state is None:
        return None
    return state / USER_CONTEXTS / f"{os.getpid() if pid is None else pid}.json"


def user_context_paths(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Every per-user context file, the latest written first, then an older gfair's single one.

    Latest first: of two running clusters, a tool reaches the one started last, as it did when
    there was one file that each `gfair up` overwrote.
    """
    state = user_state_dir(environ)
    if state is None:
        return []
    found: list[tuple[float, Path]] = []
    with contextlib.suppress(OSError):
        for path in (state / USER_CONTEXTS).glob("*.json"):
            with contextlib.suppress(OSError):
                found.append((path.stat().st_mtime, path))
    found.sort(key=lambda item: (item[0], item[1].name), reverse=True)
    return [path for _, path in found] + [state / CONTEXT_FILE]


def context_paths(
    cwd: Path | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Path, ...]:
    """Where a client looks, in order: this directory's `gfair up`, then the user's, latest
    first."""
    local = (cwd or Path.cwd()) / DEFAULT_DATA_DIR / CONTEXT_FILE
    return (local, *user_context_paths(environ))


def read_context(path: Path) -> ClusterContext | None:
    """The context in `path`; None when there is none or it cannot be read as one.

    A broken file must not stop a tool that could still reach the cluster another way, so it
    counts as absent here; `ClusterContext.from_json` says what is wrong with it.
    """
    try:
        return ClusterContext.from_json(path.read_text(), path)
    except (OSError, UnicodeDecodeError, ContextError):
        return None


def running_context(paths: Iterable[Path] | None = None) -> ClusterContext | None:
    """The first context, of `paths` (default `context_paths()`), whose `gfair up` still runs."""
    for path in context_paths() if paths is None else paths:
        found = read_context(path)
        if found is not None and found.running:
            return found
    return None


@dataclass(frozen=True)
class ClusterAddress:
    """The NATS servers a tool should use, and what named them (for messages)."""

    servers: tuple[str, ...]
    source: str
    # The credentials file of the context the servers came from, if it names one.
    creds: str | None = None


def locate_cluster(
    environ: Mapping[str, str] | None = None, paths: Iterable[Path] | None = None
) -> ClusterAddress:
    """Steps 2 to 4 of the order above (step 1 is the caller's): where NATS is."""
    env = os.environ if environ is None else environ
    configured = env.get(NATS_URL_ENV, "").strip()
    if configured:
        return ClusterAddress(split_servers(configured), f"${NATS_URL_ENV}")
    found = running_context(context_paths(environ=env) if paths is None else paths)
    if found is not None and found.servers:
        return ClusterAddress(
            found.servers,
            f"the context of `gfair up` (pid {found.pid}) in {found.path}",
            creds=found.creds,
        )
    return ClusterAddress(split_servers(DEFAULT_NATS_URL), "the default")


def split_servers(urls: str | Iterable[str]) -> tuple[str, ...]:
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    servers = tuple(url.strip() for url in items if url.strip())
    if not servers:
        raise ValueError("no NATS server URL given")
    return servers


# -- the writer's side (`gfair up`) --------------------------------------------------------------


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (Linux); None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after it are plain.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of stat(5), counted from field 3
    except (IndexError, ValueError):
        return None


def process_running(pid: int, started: int | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by someone else
    if started is None:
        return True
    now = process_start_ticks(pid)
    return now is None or now == started


def write_context(context: ClusterContext, paths: Iterable[Path]) -> list[Path]:
    """Write `context` to each of `paths` (atomically); the paths written.

    A path that cannot be written (a read-only home) is skipped: the cluster runs all the same
    and can still be reached by its URL.
    """
    written = []
    text = context.to_json()
    for path in paths:
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(text)
            os.replace(partial, path)
        except OSError:
            with contextlib.suppress(OSError):
                partial.unlink()
            continue
        written.append(path)
    return written


def remove_context(paths: Iterable[Path], pid: int) -> None:
    """Remove those of `paths` that still describe process `pid`.

    Another `gfair up` started since on the same data dir may have taken its file over; that
    one stays.
    """
    for path in paths:
        found = read_context(path)
        if found is not None and found.pid == pid:
            with contextlib.suppress(OSError):
                path.unlink()


def remove_stale_contexts(environ: Mapping[str, str] | None = None) -> None:
    """Remove the per-user files of `gfair up`s that are gone (killed before they could)."""
    state = user_state_dir(environ)
    if state is None:
        return
    with contextlib.suppress(OSError):
        for path in (state / USER_CONTEXTS).glob("*.json"):
            found = read_context(path)
            if found is None or not found.running:
                with contextlib.suppress(OSError):
                    path.unlink()


def own_context(
    nats_url: str,
    *,
    data_dir: Path | None = None,
    span_file: Path | None = None,
    started_at: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClusterContext:
    """The context of a cluster this process runs; its credentials file from the environment."""
    env = os.environ if environ is None else environ
    creds = env.get(CREDS_ENV) or None
    pid = os.getpid()
    return ClusterContext(
        nats_url=nats_url,
        pid=pid,
        pid_started=process_start_ticks(pid),
        data_dir=str(data_dir) if data_dir is not None else None,
        creds=str(Path(creds).absolute()) if creds else None,
        span_file=str(span_file) if span_file is not None else None,
        started_at=started_at,
    )
