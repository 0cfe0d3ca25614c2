"""`gfair tenants`: the NATS authorization of the cluster's tenants, rendered from a TOML file.

gfair tenants render deploy/nats/tenants.toml -o deploy/nats/auth.conf
gfair tenants render deploy/nats/tenants.toml --check deploy/nats/auth.conf   (CI)
gfair tenants list deploy/nats/tenants.toml
gfair tenants add-node deploy/nats/tenants.toml gpu-2 --env .env > gpu-2.env
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from gfair.cli.arguments import add_command
from gfair.events.subjects import SubjectError, validate_token
from gfair.tenancy import (
    NodeLogin,
    Tenants,
    TenantsError,
    load_tenants,
    node_permissions,
    parse_tenants,
    render_auth_conf,
    tenant_permissions,
)

# What a GPU server's executor needs besides its own login (deploy/gpu-server/compose.yaml).
EVENT_ID_KEY_VARIABLE = "GFAIR_EVENT_ID_KEY"


# What `gfair tenants --help` says it does.
_DESCRIPTION = (
    "Tenants are declared in a TOML file (deploy/nats/tenants.toml); the NATS server's "
    "authorization (deploy/nats/auth.conf) is rendered from it."
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "tenants", _DESCRIPTION)
    commands = parser.add_subparsers(dest="tenants_command", metavar="COMMAND")
    commands.required = True

    render = commands.add_parser("render", help="write auth.conf for the tenants file")
    render.add_argument("file", type=Path, help="tenants file (TOML)")
    target = render.add_mutually_exclusive_group()
    target.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    target.add_argument(
        "--check",
        type=Path,
        metavar="AUTH_CONF",
        help="change nothing; exit 1 if AUTH_CONF differs from what would be rendered",
    )
    render.set_defaults(func=run_render)

    listing = commands.add_parser(
        "list", help="each tenant's and node's password variable, inbox prefix and permissions"
    )
    listing.add_argument("file", type=Path, help="tenants file (TOML)")
    listing.set_defaults(func=run_list)

    add_node = commands.add_parser(
        "add-node",
        help="declare a GPU server's node, re-render auth.conf, give its login a password in the "
        "broker's env file, and print the server's .env lines",
        description=(
            "Adds [[nodes]] id = NODE_ID to FILE (unless there), re-renders AUTH_CONF, and adds "
            "GFAIR_NODE_<ID>_PASSWORD with a fresh secret to ENV (unless there), the .env the "
            "broker reads. Prints, for the server's .env, GFAIR_NODE_ID, GFAIR_NODE_PASSWORD and "
            "ENV's GFAIR_EVENT_ID_KEY. Run again, it changes nothing and prints the same. The "
            "broker takes the new login when restarted (docker compose up -d nats)."
        ),
    )
    add_node.add_argument("file", type=Path, help="tenants file (TOML)")
    add_node.add_argument("node_id", help="the server's node id (its executor's GFAIR_NODE_ID)")
    add_node.add_argument(
        "--auth-conf",
        type=Path,
        help="the authorization to re-render (default: auth.conf beside FILE)",
    )
    add_node.add_argument(
        "--env",
        type=Path,
        default=Path(".env"),
        help="the env file the broker reads its passwords from (default: ./.env)",
    )
    add_node.set_defaults(func=run_add_node)


def display_path(path: Path) -> str:
    """`path` as the rendered header names it: relative when it can be, never a machine path."""
    if not path.is_absolute():
        return path.as_posix()
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.name


def _load(path: Path) -> Tenants | None:
    try:
        return load_tenants(path)
    except TenantsError as error:
        print(f"gfair: {error}", file=sys.stderr)
        return None


def run_render(args: argparse.Namespace) -> int:
    tenants = _load(args.file)
    if tenants is None:
        return 1
    text = render_auth_conf(tenants, source=display_path(args.file))
    if args.check is not None:
        try:
            current = args.check.read_text(encoding="utf-8")
        except OSError as error:
            print(f"gfair: {args.check}: cannot read: {error.strerror or error}", file=sys.stderr)
            return 1
        if current != text:
            print(
                f"gfair: {args.check} is out of date with {args.file}; run "
                f"`gfair tenants render {args.file} -o {args.check}`",
                file=sys.stderr,
            )
            return 1
        print(f"{args.check}: matches {args.file}")
        return 0
    if args.output is not None:
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote {args.output} ({len(tenants.tenants)} tenant(s))", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def run_list(args: argparse.Namespace) -> int:
    tenants = _load(args.file)
    if tenants is None:
        return 1
    for tenant in tenants.tenants:
        permissions = tenant_permissions(tenant)
        print(tenant.name)
        print(f"  account:           {tenant.account}")
        print(f"  password variable: {tenant.password_variable}")
        print(f"  inbox prefix:      {tenant.inbox_prefix}")
        print(f"  publish:           {', '.join(permissions.publish_allow)}")
        print(f"  subscribe:         {', '.join(permissions.subscribe_allow)}")
    for node in tenants.nodes:
        permissions = node_permissions(node)
        print(f"node {node.node_id}")
        print(f"  user:              {node.user}")
        print(f"  password variable: {node.password_variable}")
        print(f"  inbox prefix:      {node.inbox_prefix}")
        print(f"  publish:           {', '.join(permissions.publish_allow)}")
        print(f"  subscribe:         {', '.join(permissions.subscribe_allow)}")
    return 0


def read_env(path: Path) -> dict[str, str]:
    """The variables of a compose env file (`NAME=value` lines; quotes around a value taken
    off); empty if there is no file."""
    if not path.exists():
        return {}
    found: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, equals, value = line.strip().removeprefix("export ").partition("=")
        if not equals or name.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[name.strip()] = value
    return found


def _append_env(path: Path, name: str, value: str) -> None:
    # Created readable by its owner only: it holds the cluster's passwords.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(descriptor, "a", encoding="utf-8") as env:
        if env.tell() > 0 and not path.read_text(encoding="utf-8").endswith("\n"):
            env.write("\n")
        env.write(f"{name}={value}\n")


def run_add_node(args: argparse.Namespace) -> int:
    try:
        # Checked before it goes into the TOML text: a token needs no quoting there.
        validate_token(args.node_id, what="node id")
    except SubjectError as error:
        print(f"gfair: {error}", file=sys.stderr)
        return 1
    tenants = _load(args.file)
    if tenants is None:
        return 1
    node = NodeLogin(args.node_id)
    if node not in tenants.nodes:
        text = args.file.read_text(encoding="utf-8").rstrip("\n")
        text += f'\n\n[[nodes]]\nid = "{node.node_id}"\n'
        try:
            tenants = parse_tenants(text, source=str(args.file))
        except TenantsError as error:
            print(f"gfair: {error}", file=sys.stderr)
            return 1
        args.file.write_text(text, encoding="utf-8")
        print(f"declared node {node.node_id} in {args.file}", file=sys.stderr)
    auth_conf = args.auth_conf or args.file.with_name("auth.conf")
    auth_conf.write_text(render_auth_conf(tenants, source=display_path(args.file)), "utf-8")
    print(f"wrote {auth_conf}", file=sys.stderr)
    env = read_env(args.env)
    password = env.get(node.password_variable)
    if not password:
        password = secrets.token_hex(32)
        _append_env(args.env, node.password_variable, password)
        print(f"added {node.password_variable} to {args.env}", file=sys.stderr)
    print(f"GFAIR_NODE_ID={node.node_id}")
    print(f"GFAIR_NODE_PASSWORD={password}")
    key = env.get(EVENT_ID_KEY_VARIABLE)
    if key:
        print(f"{EVENT_ID_KEY_VARIABLE}={key}")
    else:
        print(
            f"gfair: {args.env} has no {EVENT_ID_KEY_VARIABLE}: give the server the control "
            "plane's",
            file=sys.stderr,
        )
    print(
        "restart the broker for the login to take effect (docker compose up -d nats); the "
        "lines above go into the server's .env",
        file=sys.stderr,
    )
    return 0
