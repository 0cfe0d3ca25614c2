#!/usr/bin/env bash
# Build the example job image (Dockerfile): wheels of CPU torch downloaded by pip on this host
# (its index, proxy and certificates), then a build that reaches no network.
#
#   examples/images/pytorch/build.sh [TAG]     # default gfair-example/pytorch:cpu
#   BASE=gfair-local/python:bookworm examples/images/pytorch/build.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
tag=${1:-gfair-example/pytorch:cpu}
base=${BASE:-python:3.11-slim}
torch=${TORCH:-torch==2.13.0}
pip=${PIP:-$repo/.venv/bin/pip}
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
"$pip" download --quiet --only-binary=:all: --dest "$context/wheels" "$torch"
cp "$here/Dockerfile" "$repo/examples/pytorch_train.py" "$context/"
docker build --quiet --build-arg "BASE=$base" --tag "$tag" "$context"
