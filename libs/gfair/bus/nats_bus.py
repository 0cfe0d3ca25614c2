"""`Bus` on NATS JetStream (nats-py).

Connection loss is survived rather than reported: the client reconnects forever, buffered
publishes are flushed after reconnecting, a publish whose acknowledgement did not come back is
retried with the same message id (JetStream stores it once), and a pull that fails while
reconnecting simply returns no messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.js import api

from gfair.bus.key_value import KeyValue
from gfair.bus.nats_consumer import NatsPullConsumer, consumer_config
from gfair.bus.nats_kv import NatsKeyValue
from gfair.bus.subject_filter import validate_subject
from gfair.bus.topology import BucketSpec, ConsumerSpec, StreamSpec, Topology
from gfair.bus.transport import (
    MSG_ID_HEADER,
    BusError,
    NoStreamForSubject,
    PubAck,
    PublishFailed,
    PullConsumer,
    StoredMessage,
    TopologyConflict,
)

_log = structlog.get_logger("gfair.bus.nats")
T = TypeVar("T")

_STREAM_NAME_IN_USE = 10058
# "duplicate message id is in process": an earlier attempt with the same message id is still
# being stored (a leader change held it up); the next attempt is told it is a duplicate.
_DUPLICATE_IN_PROCESS = 10158


# Consumers looked up or declared again at once, at most, per connection: after a stall, every
# consumer of a connection goes silent together (a process running hundreds of them, virtual
# nodes), and as many API requests at once would only stall the broker further.
RECOVERIES_AT_ONCE = 4

DEFAULT_INBOX_PREFIX = "_INBOX"
_INBOX_USER = re.compile(r"[A-Za-z0-9_-]{1,64}")


# The server maps the reply subject of a request that crosses from a tenant's account into the
# services' through a service import (`gfair.tenancy`) to one under this prefix, and the answer
# published there back to the asker's own reply subject, in the asker's own account.
IMPORT_REPLY_PREFIX = "_R_"


def inbox_prefix_for(user: str) -> str:
    """Where replies to `user`'s requests go: `_INBOX_<user>`.

    The shipped authorization lets a tenant subscribe to its own `_INBOX_<tenant>.>` only. On
    the shared `_INBOX.>` a tenant could read the replies to everybody's requests, and those
    include JetStream acks and the messages a pull consumer hands out: other users' events.
    """
    if not _INBOX_USER.fullmatch(user):
        raise ValueError(f"no inbox prefix for NATS user {user!r}: not a subject token")
    return f"{DEFAULT_INBOX_PREFIX}_{user}"


def redact_url(url: str) -> str:
    """`url` without the password or token it may carry (nats://user:secret@host)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


@dataclass(frozen=True, slots=True)
class NatsOptions:
    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    name: str | None = None
    connect_timeout_s: float = 2.0
    # A service may start before its server; keep trying this long before giving up.
    initial_connect_deadline_s: float = 30.0
    reconnect_wait_s: float = 0.5
    max_reconnect_attempts: int = -1
    api_timeout_s: float = 5.0
    publish_attempt_timeout_s: float = 2.0
    publish_deadline_s: float = 30.0
    drain_timeout_s: float = 10.0
    # Credentials, at most one kind: user (and password), a token, a .creds file (user JWT and
    # NKey seed, decentralised auth) or an NKey seed file. Secrets stay out of repr and logs.
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    user_credentials: str | None = None
    nkeys_seed: str | None = None
    # TLS: a CA to trust (else the system's), a client certificate and key for servers that
    # verify clients, and the name to expect on the server's certificate when it differs from
    # the URL's host. Any of them, or a tls:// URL, turns TLS on.
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_hostname: str | None = None
    # Start TLS before the server says anything (server side: `tls { handshake_first: true }`),
    # so nothing, credentials included, ever crosses the link in plaintext.
    tls_handshake_first: bool = False
    # None: `_INBOX_<user>` when a user is given (see `inbox_prefix_for`), else NATS's `_INBOX`.
    inbox_prefix: str | None = None

    def __post_init__(self) -> None:
        kinds = [
            kind
            for kind, given in (
                ("user", self.user is not None),
                ("token", self.token is not None),
                ("user_credentials", self.user_credentials is not None),
                ("nkeys_seed", self.nkeys_seed is not None),
            )
            if given
        ]
        if len(kinds) > 1:
            raise ValueError(f"NATS credentials: give one of {' / '.join(kinds)}, not several")
        if self.password is not None and self.user is None:
            raise ValueError("NATS credentials: a password needs a user")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("NATS TLS: a client certificate and its key go together")
        if self.inbox_prefix is not None and not _INBOX_USER.fullmatch(self.inbox_prefix):
            raise ValueError(f"NATS inbox prefix {self.inbox_prefix!r} is not a subject token")

    @property
    def uses_tls(self) -> bool:
        files = (self.tls_ca_file, self.tls_cert_file, self.tls_hostname)
        return (
            self.tls_handshake_first
            or any(f is not None for f in files)
            or any(urlsplit(url).scheme == "tls" for url in self.servers)
        )

    @property
    def effective_inbox_prefix(self) -> str:
        if self.inbox_prefix is not None:
            return self.inbox_prefix
        if self.user is not None and _INBOX_USER.fullmatch(self.user):
            return inbox_prefix_for(self.user)
        return DEFAULT_INBOX_PREFIX

    def redacted_servers(self) -> list[str]:
        return [redact_url(url) for url in self.servers]

    def tls_context(self) -> ssl.SSLContext | None:
        """Client-side TLS, or None when none is asked for; `BusError` names a bad file."""
        if not self.uses_tls:
            return None
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise BusError(f"NATS TLS: cannot load CA file {self.tls_ca_file}: {exc}") from exc
        if self.tls_cert_file is not None and self.tls_key_file is not None:
            try:
                context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
            except (OSError, ssl.SSLError) as exc:
                raise BusError(
                    f"NATS TLS: cannot load client certificate {self.tls_cert_file} "
                    f"with key {self.tls_key_file}: {exc}"
                ) from exc
        return context

    def auth_kwargs(self) -> dict[str, Any]:
        """Credentials, TLS and inbox prefix as `nats.connect` keyword arguments."""
        kwargs: dict[str, Any] = {
            key: value
            for key, value in (
                ("user", self.user),
                ("password", self.password),
                ("token", self.token),
                ("user_credentials", self.user_credentials),
                ("nkeys_seed", self.nkeys_seed),
                ("tls", self.tls_context()),
                ("tls_hostname", self.tls_hostname),
            )
            if value is not None
        }
        if self.tls_handshake_first:
            kwargs["tls_handshake_first"] = True
        kwargs["inbox_prefix"] = self.effective_inbox_prefix
        return kwargs


def _stream_config(spec: StreamSpec) -> api.StreamConfig:
    return api.StreamConfig(
        name=spec.name,
        description=spec.description or None,
        subjects=list(spec.subjects),
        retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.OLD,
        duplicate_window=spec.duplicate_window_s,
        max_age=spec.max_age_s,
        max_bytes=spec.max_bytes,
        max_msgs_per_subject=spec.max_msgs_per_subject or -1,
        max_msg_size=spec.max_msg_size if spec.max_msg_size is not None else -1,
        storage=api.StorageType(spec.storage.value),
        num_replicas=spec.replicas,
    )


def _as_declared(config: api.StreamConfig) -> tuple[object, ...]:
    """The settings a `StreamSpec` declares, as the server reports them back."""

    def unset_if_negative(value: int | None) -> int | None:
        return None if value is None or value < 0 else value

    return (
        config.description or None,
        tuple(sorted(config.subjects or ())),
        config.retention,
        config.discard,
        config.duplicate_window,
        config.max_age or None,
        unset_if_negative(config.max_bytes),
        unset_if_negative(config.max_msgs_per_subject),
        unset_if_negative(config.max_msg_size),
        config.storage,
        config.num_replicas,
    )


_TRANSIENT_API_ERRORS = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
)


# How the server says it will never let these credentials in; nats-py reports it through the
# error callback only, and retries.
_REFUSALS = ("authorization violation", "authentication", "authorization failed")
_CUT_HANDSHAKE = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


# The server's -ERR for a publish this login may not make, as nats-py reports it.
_DENIED_PUBLISH = re.compile(r"permissions violation for publish to \"?([^\"'\s]+)", re.IGNORECASE)


def _refusal(exc: Exception) -> str | None:
    """Why a connection attempt can never succeed as configured, or None if retrying may help."""
    if isinstance(exc, nats.errors.AuthorizationError):
        return "the server refused the credentials"
    # A link cut mid-handshake (EOF, reset) may heal; a refused certificate will not.
    if isinstance(exc, ssl.SSLError) and not isinstance(exc, _CUT_HANDSHAKE):
        return f"TLS handshake failed: {exc}"
    text = str(exc).lower()
    if isinstance(exc, nats.errors.Error) and any(word in text for word in _REFUSALS):
        return f"the server refused the credentials ({exc})"
    return None


class _ConnectionEvents:
    """Connection callbacks; quiet once the bus itself is closing the connection."""

    def __init__(self) -> None:
        self.closing = False
        # Set on the first refusal (bad credentials, failed TLS) while still connecting.
        self.refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        # Subjects the server refused this login to publish to (its -ERR names them), in
        # lower case: nats-py lowers the whole message.
        self.denied: set[str] = set()

    async def on_error(self, exc: Exception) -> None:
        reason = _refusal(exc)
        if reason is not None and not self.refused.done():
            self.refused.set_result(reason)
        if denied := _DENIED_PUBLISH.search(str(exc)):
            self.denied.add(denied.group(1).lower())
        if not self.closing:
            _log.warning("nats connection error", error=repr(exc))

    async def on_disconnected(self) -> None:
        if not self.closing:
            _log.warning("nats disconnected")

    async def on_reconnected(self) -> None:
        _log.info("nats reconnected")


def _tls_in_use(nc: NatsClient, options: NatsOptions) -> bool:
    """Whether the connection nats-py made is encrypted.

    nats-py upgrades to TLS only when the server's INFO requires it, whatever the URL scheme or
    the TLS options say; without this check a `tls://` URL to a plaintext server, or to someone
    in between who strips the requirement, would quietly run in the clear. The check comes
    after the credentials went out; only `tls_handshake_first` keeps them from ever doing so.
    """
    info: Mapping[str, Any] = getattr(nc, "_server_info", None) or {}
    return options.tls_handshake_first or bool(info.get("tls_required"))


async def _abandon(
    nc: NatsClient, connecting: asyncio.Future[None], events: _ConnectionEvents
) -> None:
    """Give up a connection attempt: stop nats-py's retries and release the client."""
    events.closing = True
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError, nats.errors.Error, OSError, TimeoutError):
        await connecting
    with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
        await nc.close()


class NatsBus:
    def __init__(self, nc: NatsClient, options: NatsOptions) -> None:
        self._nc = nc
        self._events: _ConnectionEvents | None = None
        self._pulls: set[NatsPullConsumer] = set()
        self._ensured: set[StreamSpec | ConsumerSpec | BucketSpec] = set()
        self._js = nc.jetstream(timeout=options.api_timeout_s)
        self._options = options
        self._recovering = asyncio.Semaphore(RECOVERIES_AT_ONCE)

    @classmethod
    async def connect(cls, options: NatsOptions) -> NatsBus:
        """Connect, trying for up to `initial_connect_deadline_s` while no server answers.

        Credentials the server refuses and a TLS handshake that fails raise `BusError` at once:
        retrying cannot fix them. Errors name the servers, never a secret.
        """
        where = ", ".join(options.redacted_servers())
        deadline = time.monotonic() + options.initial_connect_deadline_s
        while True:
            events = _ConnectionEvents()
            nc = NatsClient()
            # nats-py retries a first connection like a reconnect, up to max_reconnect_attempts
            # (forever with -1), refused credentials included; the deadline bounds it here.
            connecting = asyncio.ensure_future(
                nc.connect(
                    servers=list(options.servers),
                    name=options.name,
                    connect_timeout=options.connect_timeout_s,  # type: ignore[arg-type]
                    reconnect_time_wait=options.reconnect_wait_s,  # type: ignore[arg-type]
                    max_reconnect_attempts=options.max_reconnect_attempts,
                    drain_timeout=options.drain_timeout_s,  # type: ignore[arg-type]
                    error_cb=events.on_error,
                    disconnected_cb=events.on_disconnected,
                    reconnected_cb=events.on_reconnected,
                    **options.auth_kwargs(),
                )
            )
            try:
                await asyncio.wait(
                    (connecting, events.refused),
                    timeout=max(0.0, deadline - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            except BaseException:
                await _abandon(nc, connecting, events)
                raise
            if connecting.done() and connecting.exception() is None:
                if options.uses_tls and not _tls_in_use(nc, options):
                    await _abandon(nc, connecting, events)
                    raise BusError(
                        f"cannot connect to NATS at {where}: TLS was asked for but the server "
                        "does not use it; refusing to go on in plaintext"
                    )
                bus = cls(nc, options)
                bus._events = events
                return bus
            refusal = events.refused.result() if events.refused.done() else None
            problem = f"no answer in {options.initial_connect_deadline_s:g} s"
            if refusal is None and connecting.done():
                exc = connecting.exception()
                refusal = _refusal(exc) if isinstance(exc, Exception) else None
                problem = repr(exc)
            await _abandon(nc, connecting, events)
            if refusal is not None:
                raise BusError(f"cannot connect to NATS at {where}: {refusal}")
            if time.monotonic() >= deadline:
                raise BusError(f"cannot connect to NATS at {where}: {problem}")
            await asyncio.sleep(options.reconnect_wait_s)

    @property
    def client(self) -> NatsClient:
        return self._nc

    async def _api(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """A JetStream API call, retried while the cluster is electing a leader or reconnecting.

        Only for idempotent calls (create-or-update, info, get).
        """
        deadline = time.monotonic() + self._options.publish_deadline_s
        while True:
            try:
                return await call()
            except _TRANSIENT_API_ERRORS as exc:
                if time.monotonic() >= deadline:
                    raise BusError(f"{what}: JetStream did not answer: {exc!r}") from exc
                _log.info("JetStream busy, retrying", call=what, error=repr(exc))
                await asyncio.sleep(self._options.reconnect_wait_s)

    async def wait_for_jetstream(self, timeout_s: float | None = None) -> None:
        """Until JetStream answers: a fresh cluster has no API until it elects a meta leader."""
        deadline = time.monotonic() + (timeout_s or self._options.publish_deadline_s)
        while True:
            problem: str
            try:
                # Short probes: the API's own timeout would make each miss cost seconds.
                reply = await self._nc.request(f"{api.DEFAULT_PREFIX}.INFO", b"", timeout=1.0)
                error = json.loads(reply.data).get("error")
                if error is None:
                    return
                problem = str(error.get("description", error))
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                problem = repr(exc)
            if time.monotonic() >= deadline:
                raise BusError(f"JetStream not available: {problem}")
            await asyncio.sleep(self._options.reconnect_wait_s)

    async def ensure_topology(self, topology: Topology) -> None:
        # Services sharing this connection (virtual nodes: one per server) declare the same
        # streams and buckets: each spec is ensured once per connection, not once per service.
        streams = [s for s in topology.streams if s not in self._ensured]
        consumers = [c for c in topology.consumers if c not in self._ensured]
        buckets = [b for b in topology.buckets if b not in self._ensured]
        if not (streams or consumers or buckets):
            return
        await self.wait_for_jetstream()
        for stream in streams:
            await self._ensure_stream(stream)
            self._ensured.add(stream)
        for consumer in consumers:
            await self.ensure_consumer(consumer)
            self._ensured.add(consumer)
        for bucket in buckets:
            await self._ensure_bucket(bucket)
            self._ensured.add(bucket)

    async def _ensure_stream(self, spec: StreamSpec) -> None:
        config = _stream_config(spec)
        try:
            info = await self._api(f"stream {spec.name}", lambda: self._js.stream_info(spec.name))
        except nats.js.errors.NotFoundError:
            info = None
        if info is not None and _as_declared(info.config) == _as_declared(config):
            # Nothing to change, so nothing written: a node executor's login may read stream
            # info but not change streams (deploy/nats/README.md).
            return

        async def declared() -> bool:
            try:
                await self._js.stream_info(spec.name)
            except nats.js.errors.NotFoundError:
                return False
            return True

        try:
            await self._create(
                f"stream {spec.name}", spec.name, lambda: self._js.add_stream(config), declared
            )
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise TopologyConflict(f"stream {spec.name}: {exc.description}") from exc
            try:
                await self._api(
                    f"update stream {spec.name}", lambda: self._js.update_stream(config)
                )
            except nats.js.errors.APIError as update_exc:
                raise TopologyConflict(
                    f"stream {spec.name} exists and cannot be updated: {update_exc.description}"
                ) from update_exc

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        try:
            config = consumer_config(spec)
            await self._api(
                f"add consumer {spec.durable}", lambda: self._js.add_consumer(spec.stream, config)
            )
        except nats.js.errors.APIError as exc:
            raise TopologyConflict(f"consumer {spec.durable}: {exc.description}") from exc

    async def recover_consumer(self, spec: ConsumerSpec, missing: bool = False) -> bool:
        """Declare `spec` again if the server no longer has it (or, `missing`, said it was
        deleted); whether it was declared. A few at a time per connection
        (`RECOVERIES_AT_ONCE`); one the server still has is left alone."""
        async with self._recovering:
            if not missing:
                try:
                    await self._js.consumer_info(
                        spec.stream, spec.durable, timeout=self._options.api_timeout_s
                    )
                    return False  # there: its answer was merely late
                except nats.js.errors.NotFoundError:
                    pass
            _log.warning("consumer gone, declaring it again", consumer=spec.durable)
            await self.ensure_consumer(spec)
            return True

    async def _ensure_bucket(self, spec: BucketSpec) -> None:
        try:
            await self._api(f"bucket {spec.name}", lambda: self._js.key_value(spec.name))
            return
        except nats.js.errors.BucketNotFoundError:
            pass
        config = api.KeyValueConfig(
            bucket=spec.name,
            description=spec.description or None,
            history=spec.history,
            ttl=spec.ttl_s,
            storage=api.StorageType(spec.storage.value),
            replicas=spec.replicas,
        )

        async def declared() -> bool:
            try:
                await self._js.key_value(spec.name)
            except nats.js.errors.BucketNotFoundError:
                return False
            return True

        await self._create(
            f"bucket {spec.name}",
            f"KV_{spec.name}",
            lambda: self._js.create_key_value(config),
            declared,
        )

    async def _create(
        self,
        what: str,
        stream: str,
        create: Callable[[], Awaitable[object]],
        declared: Callable[[], Awaitable[bool]],
    ) -> None:
        """Create a missing stream (or a bucket's), retried as `_api` does; where the server
        refuses this login to create it (a node executor's may only read the services'
        topology, deploy/nats/README.md), wait for the services to declare it instead of
        failing start-up on a race that starting first is enough to lose."""
        deadline = time.monotonic() + self._options.publish_deadline_s
        refused = f"$JS.API.STREAM.CREATE.{stream}".lower()
        while True:
            try:
                await create()
                return
            except _TRANSIENT_API_ERRORS as exc:
                if self._events is not None and refused in self._events.denied:
                    break
                if time.monotonic() >= deadline:
                    raise BusError(f"create {what}: JetStream did not answer: {exc!r}") from exc
                _log.info("JetStream busy, retrying", call=f"create {what}", error=repr(exc))
                await asyncio.sleep(self._options.reconnect_wait_s)
        _log.warning("waiting for the services to declare " + what, why="this login may not")
        while True:
            try:
                if await declared():
                    return
            except _TRANSIENT_API_ERRORS:
                pass
            await asyncio.sleep(self._options.reconnect_wait_s)

    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
    ) -> PubAck:
        validate_subject(subject)
        base_headers = dict(headers or {})
        if msg_id is not None:
            base_headers[MSG_ID_HEADER] = msg_id
        options = self._options
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            elapsed = time.monotonic() - started
            try:
                ack = await self._js.publish(
                    subject,
                    payload,
                    timeout=options.publish_attempt_timeout_s,
                    headers=dict(base_headers),
                )
                if attempt > 1:
                    _log.info("publish succeeded after retry", subject=subject, attempt=attempt)
                return PubAck(stream=ack.stream, sequence=ack.seq, duplicate=bool(ack.duplicate))
            except nats.js.errors.NoStreamResponseError as exc:
                # Either no stream stores the subject (final), or its stream has no leader
                # right now: restarting, or electing one after a node died (retry).
                if await self._stream_exists_for(subject) is False:
                    raise NoStreamForSubject(f"no stream stores subject {subject!r}") from exc
                if elapsed >= options.publish_deadline_s:
                    raise PublishFailed(f"stream for {subject!r} not answering") from exc
            except nats.js.errors.ServiceUnavailableError as exc:
                if elapsed >= options.publish_deadline_s:
                    raise PublishFailed(f"JetStream unavailable for {subject!r}") from exc
            except (nats.errors.TimeoutError, nats.errors.ConnectionReconnectingError) as exc:
                # Without a message id a retry could store the event twice.
                if msg_id is None or elapsed >= options.publish_deadline_s:
                    raise PublishFailed(
                        f"publish to {subject!r} not acknowledged: {exc!r}"
                    ) from exc
            except nats.js.errors.APIError as exc:
                if exc.err_code != _DUPLICATE_IN_PROCESS:
                    raise
                if elapsed >= options.publish_deadline_s:
                    raise PublishFailed(f"publish to {subject!r} still in process") from exc
            _log.debug("publish retry", subject=subject, attempt=attempt)
            await asyncio.sleep(min(0.05 * 2**attempt, 1.0))

    async def _stream_exists_for(self, subject: str) -> bool | None:
        """Whether some stream captures `subject`; None when JetStream cannot say right now."""
        request = json.dumps({"subject": subject}).encode()
        try:
            reply = await self._nc.request(
                f"{api.DEFAULT_PREFIX}.STREAM.NAMES", request, timeout=1.0
            )
            answer = json.loads(reply.data)
        except (nats.errors.Error, ValueError):
            return None
        if "error" in answer:
            return None
        return bool(answer.get("streams"))

    async def consume(self, spec: ConsumerSpec) -> PullConsumer:
        await self.ensure_consumer(spec)
        pull = NatsPullConsumer(
            spec,
            self._nc,
            api_prefix=api.DEFAULT_PREFIX,
            recover=self.recover_consumer,
            on_close=self._pulls.discard,
        )
        await pull.open()
        self._pulls.add(pull)
        return pull

    async def unread(self, spec: ConsumerSpec) -> int:
        # Asked often (every liveness check): one try, no waiting out an election.
        try:
            info = await self._js.consumer_info(spec.stream, spec.durable, timeout=1.0)
        except nats.errors.Error as exc:
            raise BusError(f"consumer {spec.durable}: no backlog: {exc!r}") from exc
        return info.num_pending or 0

    async def key_value(self, bucket: str) -> KeyValue:
        try:
            kv = await self._api(f"bucket {bucket}", lambda: self._js.key_value(bucket))
        except nats.js.errors.BucketNotFoundError:
            raise BusError(f"no key-value bucket {bucket!r}; declare it in the topology") from None
        return NatsKeyValue(kv, bucket, self)

    def history(
        self, stream: str, *, filter_subjects: tuple[str, ...] = (), start_sequence: int = 1
    ) -> AsyncIterator[StoredMessage]:
        return self.read(stream, filter_subjects=filter_subjects, start_sequence=start_sequence)

    async def read(
        self,
        stream: str,
        *,
        filter_subjects: tuple[str, ...] = (),
        start_sequence: int = 1,
        last_per_subject: bool = False,
    ) -> AsyncIterator[StoredMessage]:
        """Read through an ephemeral, unacknowledged consumer that is deleted afterwards.

        With `last_per_subject`, only the latest message of each subject (a bucket's keys).
        """
        try:
            info = await self._api(f"stream {stream}", lambda: self._js.stream_info(stream))
            end = info.state.last_seq
        except nats.js.errors.NotFoundError:
            raise BusError(f"no stream {stream!r}") from None
        if end < start_sequence or info.state.messages == 0:
            return
        name = f"history-{uuid.uuid4().hex}"
        filters = list(filter_subjects)
        config = api.ConsumerConfig(
            name=name,
            deliver_policy=(
                api.DeliverPolicy.LAST_PER_SUBJECT
                if last_per_subject
                else api.DeliverPolicy.BY_START_SEQUENCE
                if start_sequence > 1
                else api.DeliverPolicy.ALL
            ),
            opt_start_seq=start_sequence if start_sequence > 1 and not last_per_subject else None,
            ack_policy=api.AckPolicy.NONE,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
            inactive_threshold=60.0,
            # A private read cursor: nothing to replicate, and it needs no quorum to exist.
            mem_storage=True,
            num_replicas=1,
        )
        created = await self._api(
            f"history of {stream}", lambda: self._js.add_consumer(stream, config)
        )
        sub = await self._js.pull_subscribe_bind(consumer=name, stream=stream)
        # An unselective read ends at `end` and nowhere before: in a cluster its cursor may sit
        # on a replica still catching up (a broker just restarted), whose "nothing pending"
        # would end the read early. A selective read cannot know its last sequence; it ends
        # when its cursor has nothing more.
        selective = bool(filters) or last_per_subject
        try:
            done = not created.num_pending and selective
            progress_at = time.monotonic()
            while not done:
                try:
                    msgs = await sub.fetch(256, timeout=self._options.api_timeout_s)
                except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                    # 503: in a cluster a new consumer answers only once it has a leader.
                    if time.monotonic() - progress_at > self._options.publish_deadline_s:
                        raise BusError(f"reading the history of {stream} stalled") from None
                    await asyncio.sleep(self._options.reconnect_wait_s)
                    continue
                progress_at = time.monotonic()
                for msg in msgs:
                    meta = msg.metadata
                    sequence = meta.sequence.stream
                    if sequence > end:
                        done = True
                        break
                    yield StoredMessage(
                        stream=stream,
                        sequence=sequence,
                        subject=msg.subject,
                        data=msg.data,
                        headers=msg.headers or {},
                        stored_at=meta.timestamp,
                    )
                    # Bounded by the history at call time: later publishes are not read.
                    if sequence >= end or (meta.num_pending == 0 and selective):
                        done = True
                        break
        finally:
            await sub.unsubscribe()
            # On failure the inactivity threshold removes it anyway.
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await self._js.delete_consumer(stream, name)

    async def close(self) -> None:
        if self._nc.is_closed:
            return
        if self._events is not None:
            self._events.closing = True
        # A pull subscription holding an unread status message would stall the drain until
        # its timeout; nothing more will be fetched, so release them first.
        for pull in list(self._pulls):
            await pull.close()
        if self._nc.is_connected:
            try:
                await self._nc.drain()
                return
            except (nats.errors.Error, TimeoutError) as exc:
                _log.warning("drain failed, closing", error=repr(exc))
        await self._nc.close()
