"""Job spec files (`gfair submit -f`): YAML, JSON and TOML, errors that say where and what,
and the published schema agreeing with the model."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from gfair.events.job_spec import SCHEMA_FILE, JobSpecError, load_job_spec, spec_schema

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"

YAML = """\
user: alice
gpus: 2
name: resnet
job_type: ResNet-50 (batch size 32)
command: [python, train.py, --epochs, "90"]
env: {SEED: 1, MODE: fast}
max_retries: 2
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_same_job_in_yaml_json_and_toml(tmp_path: Path) -> None:
    from_yaml = load_job_spec(write(tmp_path, "job.yaml", YAML))
    assert from_yaml.user == "alice" and from_yaml.gpus == 2
    assert from_yaml.command == ("python", "train.py", "--epochs", "90")
    assert from_yaml.env == {"SEED": "1", "MODE": "fast"}  # numbers become strings
    as_json = json.dumps(yaml.safe_load(YAML))
    assert load_job_spec(write(tmp_path, "job.json", as_json)) == from_yaml
    toml = (
        'user = "alice"\ngpus = 2\nname = "resnet"\njob_type = "ResNet-50 (batch size 32)"\n'
        'command = ["python", "train.py", "--epochs", "90"]\nmax_retries = 2\n'
        '[env]\nSEED = 1\nMODE = "fast"\n'
    )
    assert load_job_spec(write(tmp_path, "job.toml", toml)) == from_yaml


def test_a_command_string_is_split_like_a_shell_would(tmp_path: Path) -> None:
    spec = load_job_spec(write(tmp_path, "job.yml", "command: python train.py --name 'a b'\n"))
    assert spec.command == ("python", "train.py", "--name", "a b")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("job.yaml", "gpus: 2\ncomand: [python]\n", "comand: Extra inputs are not permitted"),
        ("job.yaml", "gpus: none\n", "gpus: Input should be a valid integer"),
        ("job.yaml", "gpus: 0\n", "gpus: Input should be greater than or equal to 1"),
        ("job.yaml", "gpus: [2\n", "job.yaml:2:1:"),
        ("job.json", '{"gpus": 2,}', "job.json:1:12:"),
        ("job.yaml", "- python\n", "expected a mapping of fields, got list"),
        ("job.txt", "gpus: 2\n", "a job spec is .yaml, .yml, .json, .toml"),
        ("job.yaml", "workdir: relative/dir\n", "workdir"),
        ("job.yaml", 'command: "python \'unclosed"\n', "cannot split"),
    ],
)
def test_a_bad_spec_says_where_and_what(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(JobSpecError, match=None) as raised:
        load_job_spec(write(tmp_path, name, text))
    assert message in str(raised.value)
    assert str(tmp_path / name) in str(raised.value)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="No such file"):
        load_job_spec(tmp_path / "absent.yaml")


def test_the_published_schema_accepts_what_the_model_accepts() -> None:
    published = json.loads((SCHEMAS / SCHEMA_FILE).read_text())
    assert published == spec_schema()
    validator = jsonschema.Draft202012Validator(published)
    validator.validate(yaml.safe_load(YAML) | {"env": {"SEED": "1"}})
    validator.validate({"command": "python train.py"})
    assert not validator.is_valid({"comand": ["python"]})
    assert not validator.is_valid({"gpus": 0})
