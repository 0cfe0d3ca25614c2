"""Running one service process: flags and environment -> `Settings` -> the service on NATS.

`python -m gfair_services.<name>` and `gfair service <name>` both come here. The flags are
derived from the service's `Settings` model (``quantum_s`` -> ``--quantum-s``), so the command
line and the ``GFAIR_*`` environment always offer the same knobs; a flag wins over the
environment. The common flags (``--nats``, ``--span-file``, ``--log-level``) are passed on as
the environment variables the bus reads, so they reach every settings object in the process.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from types import ModuleType
from typing import Any, cast

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from gfair.bus.serve import serve
from gfair.bus.service import Service
from gfair.events.errors import describe_validation_error
from gfair_services import SERVICE_NAMES

# Common flag -> the environment variable the bus runtime reads.
COMMON_FLAGS: dict[str, tuple[str, str]] = {
    "nats": ("GFAIR_NATS_URL", "NATS server URL(s), comma-separated"),
    "span_file": ("GFAIR_SPAN_FILE", "write spans as JSON Lines to this file"),
    "log_level": ("GFAIR_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR"),
}


def canonical_name(name: str) -> str:
    """``split-stride`` and ``split_stride`` name the same service; unknown names are errors."""
    normal = name.replace("-", "_")
    if normal not in SERVICE_NAMES:
        raise ValueError(f"unknown service {name!r}; one of: {', '.join(SERVICE_NAMES)}")
    return normal


def service_module(name: str) -> ModuleType:
    return importlib.import_module(f"gfair_services.{canonical_name(name)}")


def settings_class(module: ModuleType) -> type[BaseSettings]:
    settings = getattr(module, "Settings", None)
    if not (isinstance(settings, type) and issubclass(settings, BaseSettings)):
        raise TypeError(f"{module.__name__} must export a pydantic-settings class `Settings`")
    return settings


def add_settings_flags(parser: argparse.ArgumentParser, settings: type[BaseSettings]) -> None:
    """One ``--field-name`` per settings field; absent flags leave the environment in charge."""
    for field_name, info in settings.model_fields.items():
        default = (
            ""
            if info.is_required()
            else f" (default: {info.get_default(call_default_factory=True)!r})"
        )
        parser.add_argument(
            f"--{field_name.replace('_', '-')}",
            dest=field_name,
            default=argparse.SUPPRESS,
            metavar=field_name.upper(),
            help=f"{info.description or field_name}{default}; env GFAIR_{field_name.upper()}",
        )


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    for flag, (env, text) in COMMON_FLAGS.items():
        parser.add_argument(
            f"--{flag.replace('_', '-')}", dest=f"common_{flag}", help=f"{text}; env {env}"
        )


def _flag_value(raw: str) -> object:
    # Structured fields (lists, maps) take JSON on the command line; scalars stay strings and
    # pydantic converts them exactly as it converts the same text from the environment.
    if raw[:1] in ("[", "{"):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def settings_from_flags(
    settings: type[BaseSettings], namespace: argparse.Namespace
) -> BaseSettings:
    given = vars(namespace)
    overrides: dict[str, Any] = {
        name: _flag_value(given[name]) for name in settings.model_fields if name in given
    }
    return settings(**overrides)


def export_common_flags(namespace: argparse.Namespace) -> None:
    for flag, (env, _) in COMMON_FLAGS.items():
        value = getattr(namespace, f"common_{flag}", None)
        if value:
            os.environ[env] = value


def build_parser(name: str, settings: type[BaseSettings]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"gfair service {name}",
        description=f"Run the gfair {name.replace('_', '-')} service until SIGTERM or Ctrl-C.",
    )
    add_common_flags(parser)
    add_settings_flags(parser, settings)
    return parser


def run_service(name: str, argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) for service `name` and run it; the exit code."""
    try:
        name = canonical_name(name)
    except ValueError as error:
        print(f"gfair service: {error}", file=sys.stderr)
        return 2
    try:
        module = service_module(name)
    except ModuleNotFoundError as error:
        print(f"gfair service {name}: cannot load it ({error})", file=sys.stderr)
        return 2
    settings_cls = settings_class(module)
    args = build_parser(name, settings_cls).parse_args(argv)
    export_common_flags(args)
    try:
        settings = settings_from_flags(settings_cls, args)
    except ValidationError as error:
        print(f"gfair service {name}: {describe_validation_error(error, root='')}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(module, settings))
    except KeyboardInterrupt:
        return 130
    return 0


async def _serve(module: ModuleType, settings: BaseSettings) -> None:
    own_serve = getattr(module, "serve", None)
    if own_serve is not None:
        await cast(Callable[[BaseSettings], Coroutine[Any, Any, None]], own_serve)(settings)
        return
    build = cast(Callable[[BaseSettings], Service], module.build_service)
    await serve(build(settings))
