#!/usr/bin/env bash
# Generates Go for every .proto in proto/ into the given output root (default:
# the repo root, which writes workloadapi/ and internal/echogrpc/echopb/), with
# buf (pinned in tools/buf) and protoc-gen-go and protoc-gen-go-grpc at the
# versions pinned as tools in go.mod, so that a fresh generation is
# byte-for-byte the committed code. No system protoc is needed:
# buf compiles the protos and carries the well-known types itself.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
bufdir=$("$root/hack/tools.sh" buf)

plugin_dir=$(mktemp -d)
trap 'rm -rf "$plugin_dir"' EXIT
(cd "$root" && go build -o "$plugin_dir/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go &&
	go build -o "$plugin_dir/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc)

mkdir -p "$out"
cd "$root"
PATH="$plugin_dir:$PATH" "$bufdir/buf" generate --template buf.gen.yaml -o "$out"
