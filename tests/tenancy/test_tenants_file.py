"""The tenants file, the auth.conf rendered from it, and the shipped pair agreeing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gfair.bus.server import nats_server_binary
from gfair.cli.main import main as gfair
from gfair.tenancy import (
    Tenant,
    Tenants,
    TenantsError,
    load_tenants,
    parse_tenants,
    render_auth_conf,
    tenant_permissions,
)

from .conftest import SERVER_ENV, SHIPPED

TWO = """
[[tenants]]
name = "alice"

[[tenants]]
name = "team-b"
"""


def test_a_tenants_file_parses_into_tenants() -> None:
    tenants = parse_tenants(TWO)
    assert tenants == Tenants(tenants=(Tenant("alice"), Tenant("team-b")))
    team = tenants.tenants[1]
    assert team.password_variable == "GFAIR_TENANT_TEAM_B_PASSWORD"
    assert team.inbox_prefix == "_INBOX_team-b"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[tenants]]\nname = 'a.b'", "tenants[0].name: name must be 1 to 64"),
        ("[[tenants]]\nname = 'alice'\n[[tenants]]", "tenants[1].name: required"),
        ("[[tenants]]\nname = 'x'\nhistroy = false", "tenants[0].histroy: unknown key"),
        ("[[tenants]]\nname = 'x'\nhistory = false", "tenants[0].history: no longer used"),
        ("tenant = []", "tenant: unknown key"),
        ("tenants = 3", "tenants: expected an array of tables"),
        ("[jetstream]\nprotected_consumers = ['p']", "jetstream: no longer used"),
        ("[[tenants]]\nname = 'operator'", "operator"),
        (
            "[[tenants]]\nname = 'a-b'\n[[tenants]]\nname = 'a_b'",
            "would share the password variable GFAIR_TENANT_A_B_PASSWORD",
        ),
        ("[[tenants]\nname = 'x'", "line 1"),
        ("[[nodes]]\nname = 'n1'", "nodes[0].name: unknown key"),
        ("[[nodes]]\nid = 'a.b'", "nodes[0].id: id must be 1 to 64"),
        ("[[nodes]]\nid = '" + "n" * 60 + "'", "nodes[0].id: its NATS user must be 1 to 64"),
        ("nodes = 'n1'", "nodes: expected an array of tables"),
        ("[[tenants]]\nname = 'node-n1'\n[[nodes]]\nid = 'n1'", "its user 'node-n1' is taken"),
        (
            "[[nodes]]\nid = 'a-b'\n[[nodes]]\nid = 'a_b'",
            "would share the password variable GFAIR_NODE_A_B_PASSWORD",
        ),
    ],
)
def test_a_bad_tenants_file_is_refused_naming_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(TenantsError) as refused:
        parse_tenants(text, source="t.toml")
    assert str(refused.value).startswith("t.toml: ")
    assert message in str(refused.value)


def test_a_tenant_may_publish_its_requests_and_questions_and_no_jetstream_api() -> None:
    alice, team = (tenant_permissions(t) for t in parse_tenants(TWO).tenants)
    assert alice.publish_allow == (
        "gfair.submit.alice",
        "gfair.cancel.alice",
        "gfair.query.alice.*",
    )
    assert team.subscribe_allow == ("gfair.job.team-b.>", "_INBOX_team-b.>")


@pytest.mark.nats
@pytest.mark.parametrize(
    "text",
    [TWO, "", "[[nodes]]\nid = 'solo'", "[[tenants]]\nname = '1234'"],
)
def test_what_is_rendered_is_a_configuration_the_server_accepts(
    tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenants = parse_tenants(text)
    for name, value in SERVER_ENV.items():
        monkeypatch.setenv(name, value)
    for login in (*tenants.tenants, *tenants.nodes):
        monkeypatch.setenv(login.password_variable, "pw")
    (tmp_path / "auth.conf").write_text(render_auth_conf(tenants))
    config = tmp_path / "nats.conf"
    config.write_text("include ./auth.conf\n")
    checked = subprocess.run(
        [str(nats_server_binary()), "-c", str(config), "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_shipped_auth_conf_is_what_the_shipped_tenants_file_renders() -> None:
    tenants = load_tenants(SHIPPED / "tenants.toml")
    assert (SHIPPED / "auth.conf").read_text() == render_auth_conf(
        tenants, source="deploy/nats/tenants.toml"
    ), "re-render: gfair tenants render deploy/nats/tenants.toml -o deploy/nats/auth.conf"


def test_the_cli_renders_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "tenants.toml"
    source.write_text(TWO)
    target = tmp_path / "auth.conf"

    assert gfair(["tenants", "render", str(source), "-o", str(target)]) == 0
    assert gfair(["tenants", "render", str(source), "--check", str(target)]) == 0
    assert target.read_text() == render_auth_conf(parse_tenants(TWO), source="tenants.toml")

    source.write_text(TWO + '\n[[tenants]]\nname = "carol"\n')
    assert gfair(["tenants", "render", str(source), "--check", str(target)]) == 1
    assert "out of date" in capsys.readouterr().err

    source.write_text("[[tenants]]\nname = 'a b'\n")
    assert gfair(["tenants", "render", str(source)]) == 1
    assert "tenants[0].name" in capsys.readouterr().err


def test_the_cli_lists_what_each_tenant_needs(capsys: pytest.CaptureFixture[str]) -> None:
    assert gfair(["tenants", "list", str(SHIPPED / "tenants.toml")]) == 0
    out = capsys.readouterr().out
    assert "GFAIR_TENANT_ALICE_PASSWORD" in out
    assert "_INBOX_bob" in out


def test_adding_a_node_declares_it_renders_and_keeps_one_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "tenants.toml"
    source.write_text(TWO)
    env = tmp_path / ".env"
    env.write_text("GFAIR_EVENT_ID_KEY='k' \n# a comment\nOTHER=1")  # no newline at its end
    add = ["tenants", "add-node", str(source), "gpu-2", "--env", str(env)]

    assert gfair(add) == 0
    printed = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    password = printed["GFAIR_NODE_PASSWORD"]
    assert printed == {
        "GFAIR_NODE_ID": "gpu-2",
        "GFAIR_NODE_PASSWORD": password,
        "GFAIR_EVENT_ID_KEY": "k",
    }
    assert len(password) == 64
    tenants = load_tenants(source)
    assert [n.node_id for n in tenants.nodes] == ["gpu-2"]
    assert (tmp_path / "auth.conf").read_text() == render_auth_conf(tenants, source="tenants.toml")
    assert env.read_text().splitlines()[-2:] == ["OTHER=1", f"GFAIR_NODE_GPU_2_PASSWORD={password}"]

    # Again: nothing changes, and the same lines come out.
    before = (source.read_text(), env.read_text())
    assert gfair(add) == 0
    assert dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines()) == printed
    assert (source.read_text(), env.read_text()) == before

    # A new env file holds passwords: its owner's only.
    fresh = tmp_path / "fresh.env"
    assert gfair(["tenants", "add-node", str(source), "gpu-3", "--env", str(fresh)]) == 0
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert "GFAIR_EVENT_ID_KEY" in capsys.readouterr().err  # none to print: said so


@pytest.mark.parametrize("node_id", ['a"b', "x" * 60])
def test_a_bad_node_id_is_refused_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], node_id: str
) -> None:
    source = tmp_path / "tenants.toml"
    source.write_text(TWO)
    env = tmp_path / ".env"
    assert gfair(["tenants", "add-node", str(source), node_id, "--env", str(env)]) == 1
    assert "gfair:" in capsys.readouterr().err
    assert source.read_text() == TWO
    assert not env.exists() and not (tmp_path / "auth.conf").exists()
