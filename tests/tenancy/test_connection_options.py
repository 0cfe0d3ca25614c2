"""Client-side credentials and TLS: from `GFAIR_NATS_*` to what nats-py is given."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from gfair.bus.nats_bus import NatsOptions, inbox_prefix_for, redact_url
from gfair.bus.serve import BusSettings
from gfair.bus.transport import BusError

NATS_VARIABLES = (
    "URL",
    "USER",
    "PASSWORD",
    "TOKEN",
    "CREDS",
    "NKEY_SEED",
    "TLS_CA",
    "TLS_CERT",
    "TLS_KEY",
    "TLS_HOSTNAME",
    "TLS_FIRST",
    "INBOX_PREFIX",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NATS_VARIABLES:
        monkeypatch.delenv(f"GFAIR_NATS_{name}", raising=False)


def test_user_and_password_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GFAIR_NATS_URL", "nats://a:4222, nats://b:4222")
    monkeypatch.setenv("GFAIR_NATS_USER", "alice")
    monkeypatch.setenv("GFAIR_NATS_PASSWORD", "s3cret-pw")

    options = BusSettings().nats_options(name="tool")

    assert options.servers == ("nats://a:4222", "nats://b:4222")
    assert options.auth_kwargs() == {
        "user": "alice",
        "password": "s3cret-pw",
        "inbox_prefix": "_INBOX_alice",
    }


def test_secrets_stay_out_of_representations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GFAIR_NATS_USER", "alice")
    monkeypatch.setenv("GFAIR_NATS_PASSWORD", "s3cret-pw")
    settings = BusSettings()
    token_options = NatsOptions(token="t0ken-value")

    for text in (repr(settings), str(settings), repr(settings.nats_options()), repr(token_options)):
        assert "s3cret-pw" not in text
        assert "t0ken-value" not in text
    assert redact_url("nats://alice:s3cret-pw@host:4222") == "nats://***@host:4222"
    assert redact_url("tls://t0ken-value@host") == "tls://***@host"
    assert redact_url("nats://host:4222") == "nats://host:4222"
    assert NatsOptions(servers=("nats://u:s3cret-pw@h:1",)).redacted_servers() == ["nats://***@h:1"]


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GFAIR_NATS_TOKEN", "")
    monkeypatch.setenv("GFAIR_NATS_USER", "svc")
    assert BusSettings().nats_options().token is None


def test_a_token_and_a_user_together_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GFAIR_NATS_USER", "alice")
    monkeypatch.setenv("GFAIR_NATS_TOKEN", "tok")
    with pytest.raises(ValidationError, match="one of user / token"):
        BusSettings()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"password": "x"}, "a password needs a user"),
        ({"tls_cert_file": "c.pem"}, "certificate and its key go together"),
        ({"user_credentials": "a.creds", "nkeys_seed": "s.nk"}, "not several"),
        ({"inbox_prefix": "_INBOX.alice"}, "not a subject token"),
    ],
)
def test_inconsistent_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NatsOptions(**options)  # type: ignore[arg-type]


def test_a_missing_file_names_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GFAIR_NATS_TLS_CA", str(tmp_path / "absent.pem"))
    with pytest.raises(ValidationError, match="nats_tls_ca"):
        BusSettings()


def test_creds_and_nkey_files_are_passed_to_nats_py(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    creds = tmp_path / "alice.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\n...\n")
    monkeypatch.setenv("GFAIR_NATS_CREDS", str(creds))
    monkeypatch.setenv("GFAIR_NATS_INBOX_PREFIX", "_INBOX_alice")

    kwargs = BusSettings().nats_options().auth_kwargs()

    # Who the .creds file logs in as is inside the JWT; the inbox prefix must then be given.
    assert kwargs == {"user_credentials": str(creds), "inbox_prefix": "_INBOX_alice"}


def test_the_inbox_prefix_follows_the_user_unless_given() -> None:
    assert NatsOptions().effective_inbox_prefix == "_INBOX"
    assert NatsOptions(user="bob").effective_inbox_prefix == "_INBOX_bob"
    assert NatsOptions(user="bob", inbox_prefix="_INBOX_x").effective_inbox_prefix == "_INBOX_x"
    # A user name that is no subject token (possible for services) keeps the default.
    assert NatsOptions(user="svc@example").effective_inbox_prefix == "_INBOX"
    with pytest.raises(ValueError, match="not a subject token"):
        inbox_prefix_for("a.b")


def test_tls_is_on_with_any_tls_option_or_a_tls_url() -> None:
    assert not NatsOptions().uses_tls
    assert NatsOptions().tls_context() is None
    assert NatsOptions(servers=("tls://h:4222",)).uses_tls
    assert NatsOptions(tls_handshake_first=True).uses_tls
    context = NatsOptions(servers=("tls://h:4222",)).tls_context()
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_an_unreadable_tls_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(BusError, match=r"cannot load CA file .*ca\.pem"):
        NatsOptions(tls_ca_file=str(bad)).tls_context()
