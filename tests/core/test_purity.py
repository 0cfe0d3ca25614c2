"""The core stays pure (docs/design.md §3.4): no I/O, no clock, no randomness of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import gfair.core

FORBIDDEN = {
    "asyncio", "datetime", "io", "logging", "os", "pathlib", "random", "secrets", "shutil",
    "socket", "subprocess", "sys", "tempfile", "threading", "time", "uuid",
}  # fmt: skip
FORBIDDEN_CALLS = {"open", "print", "input"}


def _modules() -> list[Path]:
    """Every module of the core, its packages' included (`gfair.core.scheduler`)."""
    return sorted(Path(gfair.core.__file__).parent.rglob("*.py"))


def test_core_modules_import_no_io_clock_or_randomness() -> None:
    offenders = []
    root = Path(gfair.core.__file__).parent
    for path in _modules():
        name = path.relative_to(root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in FORBIDDEN_CALLS
            ):
                offenders.append(f"{name}:{node.lineno}: {node.func.id}()")
    assert len(_modules()) > 10
    assert any(path.parent.name == "scheduler" for path in _modules())
    assert offenders == []
