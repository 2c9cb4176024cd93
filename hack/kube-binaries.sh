#!/usr/bin/env bash
# Builds the Kubernetes control-plane binaries pinned in tools/kube into a cache
# outside the repo and prints the directory that holds them. The directory is
# keyed by the pinned version and a hash of the tools module, so a second run
# (or a second checkout) reuses the binaries and a changed pin rebuilds them.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/tools/kube"
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$mod/go.mod")
[ -n "$version" ] || { echo "kube-binaries: no k8s.io/kubernetes pin in $mod/go.mod" >&2; exit 1; }
key=$(cat "$mod/go.mod" "$mod/go.sum" "$mod/tools.go" "$0" | sha256sum | cut -c1-12)
out="${CANOPY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/canopy}/kube/$version-$key"

minor=${version#v1.}; minor=${minor%%.*}
pkg=k8s.io/component-base/version
ldflags="-s -w \
 -X $pkg.gitVersion=$version \
 -X $pkg.gitMajor=1 \
 -X $pkg.gitMinor=$minor \
 -X $pkg.gitCommit=0000000000000000000000000000000000000000 \
 -X $pkg.gitTreeState=clean \
 -X $pkg.buildDate=1970-01-01T00:00:00Z"

for cmd in kube-apiserver kube-controller-manager; do
	if [ ! -x "$out/$cmd" ]; then
		mkdir -p "$out"
		echo "kube-binaries: building $cmd $version (cold: several minutes)" >&2
		(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
		mv "$out/$cmd.tmp" "$out/$cmd"
	fi
done
echo "$out"
