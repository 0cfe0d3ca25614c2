"""`gfair service NAME`: flags derived from each service's settings, and the tenants' tickets."""

from __future__ import annotations

from pathlib import Path

import pytest

from gfair_services import SERVICE_NAMES
from gfair_services.entrypoint import (
    build_parser,
    canonical_name,
    run_service,
    service_module,
    settings_class,
    settings_from_flags,
)
from gfair_services.split_stride import SplitStrideSettings
from gfair_services.tenants import TenantSettings, parse_user_tickets


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_every_service_follows_the_package_convention(name: str) -> None:
    module = service_module(name)
    # A service of the bus runtime builds a `Service`; one that is not (the query service,
    # on request/reply) serves itself.
    assert callable(getattr(module, "build_service", None) or getattr(module, "serve", None))
    parser = build_parser(name, settings_class(module))
    assert parser.parse_args([]) is not None  # every field has a default or comes from env


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GFAIR_QUANTUM_S", "7")
    monkeypatch.setenv("GFAIR_RELEASE_TIMEOUT_S", "9")
    parser = build_parser("split_stride", SplitStrideSettings)
    args = parser.parse_args(["--quantum-s", "2.5", "--user-tickets", "alice=2,bob=1"])
    settings = settings_from_flags(SplitStrideSettings, args)
    assert isinstance(settings, SplitStrideSettings)
    assert settings.quantum_s == 2.5  # the flag
    assert settings.release_timeout_s == 9  # the environment
    assert settings.user_tickets == {"alice": 2.0, "bob": 1.0}


def test_names_are_checked_and_bad_settings_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert canonical_name("split-stride") == "split_stride"
    with pytest.raises(ValueError, match="unknown service 'scheduler'"):
        canonical_name("scheduler")
    assert run_service("placement", ["--max-job-gpus", "0"]) == 2
    assert "max_job_gpus" in capsys.readouterr().err


def test_user_tickets_parse_from_pairs_or_json_and_name_the_bad_item() -> None:
    assert parse_user_tickets("alice=2, bob=0.5") == {"alice": 2.0, "bob": 0.5}
    assert parse_user_tickets('{"carol": 3}') == {"carol": 3.0}
    assert parse_user_tickets("") == {}
    with pytest.raises(ValueError, match="item 2"):
        parse_user_tickets("alice=2,bob")
    with pytest.raises(ValueError, match="bob"):
        parse_user_tickets("alice=2,bob=-1")
    with pytest.raises(ValueError, match="user"):
        parse_user_tickets("a.b=1")
    settings = TenantSettings(user_tickets="alice=2", default_tickets=0.5)
    assert (settings.tickets_of("alice"), settings.tickets_of("zed")) == (2.0, 0.5)


def test_a_shares_file_is_read_at_start_and_a_bad_one_refused(tmp_path: Path) -> None:
    shares = tmp_path / "shares.toml"
    shares.write_text('[accounts.lab]\n[users.alice]\naccount = "lab"\ntickets = 4\n')
    settings = TenantSettings(user_tickets="alice=2,bob=3", shares_file=shares)
    assert settings.shares is not None and settings.shares.account_of("alice") == "lab"
    # The file's tickets for its users, the flat ones for the others.
    assert (settings.tickets_of("alice"), settings.tickets_of("bob")) == (4.0, 3.0)
    assert TenantSettings().shares is None
    shares.write_text("[users.alice]\naccount = 'nowhere'\n")
    with pytest.raises(ValueError, match=r"shares\.toml:1: users\.alice: account: unknown"):
        TenantSettings(shares_file=shares)
    with pytest.raises(ValueError, match="cannot read it"):
        TenantSettings(shares_file=tmp_path / "missing.toml")
