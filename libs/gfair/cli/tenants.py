"""`gfair tenants`: the NATS authorization of the cluster's tenants, rendered from a TOML file.

gfair tenants render deploy/nats/tenants.toml -o deploy/nats/auth.conf
gfair tenants render deploy/nats/tenants.toml --check deploy/nats/auth.conf   (CI)
gfair tenants list deploy/nats/tenants.toml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gfair.tenancy import (
    Tenants,
    TenantsError,
    load_tenants,
    node_permissions,
    render_auth_conf,
    tenant_permissions,
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "tenants",
        help="render (or --check) the NATS authorization of the tenants file (tenants, nodes)",
        description=(
            "Tenants are declared in a TOML file (deploy/nats/tenants.toml); the NATS server's "
            "authorization (deploy/nats/auth.conf) is rendered from it."
        ),
    )
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
