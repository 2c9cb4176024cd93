#!/usr/bin/env bash
# Generates Go for every .proto in proto/ into the given output root (default:
# the repo root, which writes workloadapi/). Uses protoc from the system and
# protoc-gen-go at the version pinned as a tool in go.mod, so that a fresh
# generation is byte-for-byte the committed code.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
command -v protoc >/dev/null || { echo "gen-proto: protoc not found: run make deps" >&2; exit 1; }

plugin_dir=$(mktemp -d)
trap 'rm -rf "$plugin_dir"' EXIT
(cd "$root" && go build -o "$plugin_dir/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go)

mkdir -p "$out"
cd "$root/proto"
protoc -I . \
	--plugin=protoc-gen-go="$plugin_dir/protoc-gen-go" \
	--go_out="$out" --go_opt=module=github.com/canopy-mesh/canopy \
	*.proto
