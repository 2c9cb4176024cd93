#!/usr/bin/env bash
# Generates Go for every .proto in proto/ into the given output root (default:
# the repo root, which writes workloadapi/), with buf (pinned in tools/buf) and
# protoc-gen-go at the version pinned as a tool in go.mod, so that a fresh
# generation is byte-for-byte the committed code. No system protoc is needed:
# buf compiles the protos and carries the well-known types itself.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
bufdir=$("$root/hack/tools.sh" buf)

plugin_dir=$(mktemp -d)
trap 'rm -rf "$plugin_dir"' EXIT
(cd "$root" && go build -o "$plugin_dir/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go)

mkdir -p "$out"
cd "$root"
PATH="$plugin_dir:$PATH" "$bufdir/buf" generate --template buf.gen.yaml -o "$out"
