"""The `gfair` entry point: lazy subcommands, `--version`, completion scripts, closed pipes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from gfair.cli import completion
from gfair.cli.main import COMMANDS, EXIT_BROKEN_PIPE, build_parser, main

GFAIR = [sys.executable, "-m", "gfair.cli.main"]
# What `gfair --help` must not pay for: each costs from 0.1 s to over a second to import.
HEAVY = ("nats", "matplotlib", "highspy", "numpy", "pydantic", "rich", "opentelemetry")


def test_the_lazy_table_matches_every_real_parser() -> None:
    parser = build_parser(complete=True)
    (commands,) = (a for a in parser._actions if a.dest == "command")
    helps = {a.dest: a.help for a in commands._choices_actions}  # type: ignore[attr-defined]
    assert helps == {name: help_line for name, (_, help_line) in COMMANDS.items()}


def test_help_imports_nothing_heavy() -> None:
    probe = (
        "import json, sys\n"
        "from gfair.cli.main import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps(heavy), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
    assert "submit a job" in done.stdout and "completion" in done.stdout


def test_a_command_imports_only_its_own_module() -> None:
    probe = (
        "import sys\n"
        "from gfair.cli.main import main\n"
        "main(['completion', 'bash'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('gfair.cli.')), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    # completion needs the whole tree; a query command does not.
    assert "gfair.cli.simulate" in done.stderr
    probe = probe.replace("['completion', 'bash']", "['jobs', '--help']").replace(
        "main(", "try:\n    main("
    )
    probe = probe.replace("'--help'])\n", "'--help'])\nexcept SystemExit:\n    pass\n", 1)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "gfair.cli.jobs" in done.stderr and "gfair.cli.simulate" not in done.stderr


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"gfair {version('gfair')}\n"


# Some 3.11 releases' argparse swallows a failed write of --help (and exits 0), others let it
# through to gfair's handler; a command's output fails in the command and ends it as SIGPIPE
# would. Either way, nothing on stderr.
@pytest.mark.parametrize(
    ("argv", "codes"),
    [(["--help"], {0, EXIT_BROKEN_PIPE}), (["completion", "bash"], {EXIT_BROKEN_PIPE})],
)
def test_a_closed_pipe_ends_quietly(argv: list[str], codes: set[int]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written, as after `| head -1`
    try:
        done = subprocess.run([*GFAIR, *argv], stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert done.returncode in codes
    assert done.stderr == b""


def script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


BASH_PROBE = """
complete() { :; }
source "$1"
probe() {
    COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
    _gfair
    echo "${COMPREPLY[*]}"
}
probe gfair jo
probe gfair jobs --state r
probe gfair nodes u
probe gfair submit --user nodes --gp
probe gfair simulate --report "$2/rep"
probe gfair submit --gpus 1 -- pyth
probe gfair --vers
probe gfair submit --wait -- pyth
probe gfair submit --wait c
"""


def test_bash_completion_follows_the_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gfair.bash"
    path.write_text(script("bash", capsys))
    (tmp_path / "report.json").touch()
    probe = tmp_path / "probe.bash"
    probe.write_text(BASH_PROBE)
    done = subprocess.run(
        ["bash", str(probe), str(path), str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        "jobs job",
        "running rejected",
        "uncordon",
        "--gpus",  # `nodes` was --user's value, not the subcommand
        f"{tmp_path}/report.json",  # a file option completes files
        "",  # after `--`: the shell's default completion
        "--version",
        "",  # `--wait` takes no value here: `--` still ends gfair's words
        "completed",
    ]


ZSH_PROBE = """
compdef() { print -r -- "compdef $*" }
source "$1"
compadd() { print -r -- "compadd $*" }
_describe() { print -r -- "describe ${(@P)2}" }
_files() { print -r -- files }
_normal() { print -r -- normal }
probe() { words=("$@"); CURRENT=${#words}; _gfair }
probe gfair jobs --state r
probe gfair nodes u
probe gfair simulate --plot x
probe gfair submit --gpus 1 -- pyth
"""


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completion_follows_the_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "_gfair"
    path.write_text(script("zsh", capsys))
    probe = tmp_path / "probe.zsh"
    probe.write_text(ZSH_PROBE)
    done = subprocess.run(
        ["zsh", "-f", str(probe), str(path)], capture_output=True, text=True, check=True
    )
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0] == "compdef _gfair gfair"
    tree = completion.command_tree(build_parser(complete=True))
    assert lines[1] == "compadd -- " + " ".join(tree.subcommands["jobs"].valued["--state"])
    assert lines[2] == "describe uncordon:clear a node's quarantine"
    assert lines[3].startswith("compadd -- --help --nats")
    assert lines[4:] == ["files", "normal"]
