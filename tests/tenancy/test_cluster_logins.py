"""The logins `gfair up --auth` makes from a tenants file (`gfair.cluster_logins`)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gfair.cluster_logins import (
    AUTH_CONF,
    LOGINS_FILE,
    ClusterLogins,
    embedded_tenants,
    new_password,
)
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.tenancy import NodeLogin, Tenant, Tenants, TenantsError, parse_tenants

NODES = ("v100-0", "v100-1")


def test_the_simulated_nodes_are_added() -> None:
    declared = parse_tenants(
        "[[tenants]]\nname = 'alice'\n[[nodes]]\nid = 'v100-1'\n[[nodes]]\nid = 'gpu-9'\n"
    )
    tenants = embedded_tenants(declared, node_ids=NODES)
    assert tenants.tenants == (Tenant("alice"),)
    # The file's own nodes keep their place; only those it lacks are added.
    assert tenants.nodes == (NodeLogin("v100-1"), NodeLogin("gpu-9"), NodeLogin("v100-0"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[tenants]]\nname = 'node-v100-0'", "its user 'node-v100-0' is taken"),
        ("[[tenants]]\nname = 'gfair-services'", "the services' user"),
    ],
)
def test_a_tenant_that_would_take_a_login_of_the_cluster_is_refused(
    text: str, message: str
) -> None:
    with pytest.raises(TenantsError, match=message):
        embedded_tenants(parse_tenants(text), node_ids=NODES, source="t.toml")


def test_a_bad_tenants_file_stops_the_cluster_before_it_starts(tmp_path: Path) -> None:
    missing = ClusterOptions(data_dir=tmp_path / "gfair", auth=tmp_path / "none.toml")
    with pytest.raises(TenantsError, match="cannot read"):
        EmbeddedCluster(missing)
    inside = tmp_path / "gfair" / "auth" / "tenants.toml"
    with pytest.raises(TenantsError, match="where the cluster writes"):
        EmbeddedCluster(ClusterOptions(data_dir=tmp_path / "gfair", auth=inside))
    with pytest.raises(ValueError, match="external one"):
        ClusterOptions(auth=tmp_path / "t.toml", nats_url="nats://127.0.0.1:4222")
    assert not (tmp_path / "gfair").exists()


def test_passwords_are_long_random_and_read_back_as_they_are() -> None:
    passwords = {new_password() for _ in range(200)}
    assert len(passwords) == 200
    for password in passwords:
        # The server parses a variable's value as a configuration value: a letter first,
        # letters and digits after, it stays this very string.
        assert len(password) == 32 and password.isalnum() and password[0].isalpha()


def test_every_login_has_its_own_password_given_to_the_server_by_variable() -> None:
    tenants = Tenants(tenants=(Tenant("alice"), Tenant("team-b")), nodes=(NodeLogin("v100-0"),))
    logins = ClusterLogins(tenants, source="t.toml")
    env = logins.server_env()
    assert env["GFAIR_SERVICES_USER"] == "gfair-services"
    assert set(env) == {
        "GFAIR_SERVICES_USER",
        "GFAIR_SERVICES_PASSWORD",
        "GFAIR_OPERATOR_PASSWORD",
        "GFAIR_QUERY_SERVICE_PASSWORD",
        "GFAIR_TENANT_ALICE_PASSWORD",
        "GFAIR_TENANT_TEAM_B_PASSWORD",
        "GFAIR_NODE_V100_0_PASSWORD",
    }
    passwords = [value for name, value in env.items() if name.endswith("_PASSWORD")]
    assert len(set(passwords)) == len(passwords)
    assert logins.node("v100-0").client_env() == {
        "GFAIR_NATS_USER": "node-v100-0",
        "GFAIR_NATS_PASSWORD": env["GFAIR_NODE_V100_0_PASSWORD"],
    }
    assert logins.query.client_env() == {
        "GFAIR_NATS_USER": "gfair-query",
        "GFAIR_NATS_PASSWORD": env["GFAIR_QUERY_SERVICE_PASSWORD"],
    }
    assert logins.operator.password not in repr(logins)
    # The rendered file names the variables, never a password.
    conf = logins.auth_conf()
    assert conf.startswith("# Rendered by `gfair up --auth t.toml` at every start")
    assert "$GFAIR_TENANT_TEAM_B_PASSWORD" in conf
    assert not any(password in conf for password in passwords)


def test_the_logins_are_written_private_and_removed_when_done(tmp_path: Path) -> None:
    logins = ClusterLogins(Tenants(tenants=(Tenant("alice"),)), source="t.toml")
    directory = tmp_path / "auth"
    logins.write_auth_conf(directory)
    written = logins.write_logins(directory, "nats://127.0.0.1:4222")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    names = sorted(p.name for p in directory.iterdir())
    assert names == sorted([AUTH_CONF, LOGINS_FILE, "operator.env", "alice.env"])
    for name in (LOGINS_FILE, "operator.env", "alice.env"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name
    alice = logins.tenant_logins[0]
    expected = (
        "export GFAIR_NATS_URL=nats://127.0.0.1:4222 GFAIR_NATS_USER=alice "
        f"GFAIR_NATS_PASSWORD={alice.password} GFAIR_USER=alice\n"
    )
    assert (directory / "alice.env").read_text() == expected
    assert expected in written.read_text()
    assert f"GFAIR_NATS_PASSWORD={logins.operator.password}" in written.read_text()

    # A file of an earlier run, readable by others, is made private before it is rewritten.
    (directory / LOGINS_FILE).chmod(0o644)
    logins.write_logins(directory, "nats://127.0.0.1:4222")
    assert stat.S_IMODE((directory / LOGINS_FILE).stat().st_mode) == 0o600

    logins.remove_logins(directory)
    assert [p.name for p in directory.iterdir()] == [AUTH_CONF]
