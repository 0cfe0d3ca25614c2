"""Every module, file and setting the README and docs/*.md name exists in the code.

Modules: a dotted `gfair.x...` or `gfair_services.x...` whose `x` is a module of the package
imports (its tail an attribute of it), unless the code spells it as a string (a metric's name
under a module's prefix, `gfair.node.gpus.busy`). Files: a path in code spans (`bench/quantum.py`,
`core/scheduler/`) is there, from the root, `libs/`, `libs/gfair/`, `services/` or
`services/gfair_services/`. Settings: a `GFAIR_*` variable is read somewhere in libs/,
services/, deploy/ or compose.yaml: a field of a settings class with the `GFAIR_` prefix, a
string in the code (not a docstring), or a name in the deployment files. The commands the docs
name are checked by test_cli_reference.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from functools import cache
from pathlib import Path

import pytest

import gfair
import gfair_services

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = [*sorted((ROOT / "libs").rglob("*.py")), *sorted((ROOT / "services").rglob("*.py"))]
DEPLOYMENT = [
    ROOT / "compose.yaml",
    *sorted(p for p in (ROOT / "deploy").rglob("*") if p.is_file()),
]
BASES = [
    ROOT,
    ROOT / "libs",
    ROOT / "libs/gfair",
    ROOT / "services",
    ROOT / "services/gfair_services",
]
PACKAGES = {
    "gfair": {m.name for m in pkgutil.iter_modules(gfair.__path__)},
    "gfair_services": {m.name for m in pkgutil.iter_modules(gfair_services.__path__)},
}
DOTTED = re.compile(r"(?<![\w./-])((?:gfair|gfair_services)(?:\.[A-Za-z_]\w*)+)")
FILE = re.compile(
    r"(?<![\w$./{<~-])((?:[\w.-]+/)+(?:[\w.-]*\.(?:py|ya?ml|toml|json|sh|conf|md)|[\w.-]+/))(?![\w/])"
)
# A placeholder (`<ID>`) or a wildcard (`_*`) stands for any part of a name.
VARIABLE = re.compile(r"GFAIR_(?:[A-Z0-9_]|<[A-Za-z-]+>|\*)+")


def code_spans(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return re.findall(r"`([^`\n]+)`", text)


@cache
def strings() -> tuple[frozenset[str], tuple[str, ...]]:
    """Every string constant of the code but docstrings, and as patterns the f-strings that
    build a setting's name around a part (`f"GFAIR_NODE_{stem}_PASSWORD"`)."""
    exact: set[str] = set()
    patterns: set[str] = set()
    for path in CODE:
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                head, tail = node.values[0], node.values[-1]
                if (
                    isinstance(head, ast.Constant)
                    and str(head.value).startswith("GFAIR_")
                    and isinstance(tail, ast.Constant)
                ):
                    patterns.add(
                        "".join(
                            re.escape(str(v.value)) if isinstance(v, ast.Constant) else ".+"
                            for v in node.values
                        )
                    )
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                exact |= {node.value} - ({node.value} if id(node) in docstrings else set())
    return frozenset(exact), tuple(sorted(patterns))


@cache
def settings_fields() -> frozenset[str]:
    """`GFAIR_<FIELD>` for every field of a settings class read with the `GFAIR_` prefix (or
    deriving from one)."""
    classes = [
        node
        for path in CODE
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]
    prefixed = [c for c in classes if 'env_prefix="GFAIR_"' in ast.unparse(c).replace("'", '"')]
    while below := [
        c
        for c in classes
        if c not in prefixed
        and any(isinstance(b, ast.Name) and b.id in {p.name for p in prefixed} for b in c.bases)
    ]:
        prefixed += below
    return frozenset(
        f"GFAIR_{statement.target.id.upper()}"
        for c in prefixed
        for statement in c.body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    )


@cache
def deployment_names() -> frozenset[str]:
    text = "\n".join(p.read_text(errors="replace") for p in DEPLOYMENT)
    return frozenset(re.findall(r"GFAIR_\w+", text))


def in_code(name: str) -> bool:
    exact, patterns = strings()
    return name in exact or any(re.fullmatch(pattern, name) for pattern in patterns)


def module_claim(dotted: str) -> bool:
    package, _, rest = dotted.partition(".")
    return rest.split(".")[0] in PACKAGES[package]


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def variable_read(named: str) -> bool:
    """Whether a variable the docs name (`GFAIR_NODE_<ID>_PASSWORD`, `GFAIR_NATS_TLS_*`) is read."""
    sample = re.sub(r"<[A-Za-z-]+>", "X", named)
    if named.endswith("*") or named.endswith("_"):
        prefix = sample.rstrip("*")
        known = settings_fields() | deployment_names()
        exact, patterns = strings()
        return any(k.startswith(prefix) for k in known | exact) or any(
            p.startswith(re.escape(prefix)) for p in patterns
        )
    return sample in settings_fields() or sample in deployment_names() or in_code(sample)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_named_imports(page: Path) -> None:
    named = {d for span in code_spans(page) for d in DOTTED.findall(span) if module_claim(d)}
    missing = sorted(d for d in named if not resolves(d) and not in_code(d))
    assert not missing, f"{page.relative_to(ROOT)} names modules that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_named_is_there(page: Path) -> None:
    named = {f for span in code_spans(page) for f in FILE.findall(span)}
    # `.gfair/` is what `gfair up` writes in the user's directory, not part of the repository.
    missing = sorted(
        f
        for f in named
        if not f.removeprefix("./").startswith(".gfair/")
        and not any((b / f).exists() for b in BASES)
    )
    assert not missing, f"{page.relative_to(ROOT)} names files that are not there: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_setting_named_is_read(page: Path) -> None:
    named = set(VARIABLE.findall(page.read_text()))
    missing = sorted(v for v in named if not variable_read(v))
    assert not missing, f"{page.relative_to(ROOT)} names settings nothing reads: {missing}"


def test_made_up_names_are_caught() -> None:
    assert resolves("gfair.core.cluster") and not resolves("gfair.core.no_such_module")
    assert not resolves("gfair.core.cluster.NoSuchThing")
    assert in_code("gfair.node.gpus.busy")  # a metric's name, under the module's prefix
    assert variable_read("GFAIR_QUANTUM_S") and variable_read("GFAIR_NODE_<ID>_PASSWORD")
    assert variable_read("GFAIR_NATS_TLS_*")
    assert not variable_read("GFAIR_NO_SUCH_SETTING") and not variable_read("GFAIR_NO_SUCH_*")
    assert FILE.findall("see `bench/quantum.py` and core/scheduler/") == [
        "bench/quantum.py",
        "core/scheduler/",
    ]
