#!/usr/bin/env bash
# Copies the CRDs Canopy reads from the pinned API modules into deploy/charts/canopy/crds
# (or the given directory): Istio's (istio.io/api) and the Gateway API's
# Gateway and GatewayClass (sigs.k8s.io/gateway-api, standard channel).
# Never edit them by hand: change the pins in go.mod and run make crds.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/deploy/charts/canopy/crds}
cd "$root"
dir() { go list -m -f '{{.Dir}}' "$1"; }
istio=$(dir istio.io/api)
gateway=$(dir sigs.k8s.io/gateway-api)
[ -n "$istio" ] && [ -n "$gateway" ] || { echo "crds: API modules not found: run go mod download" >&2; exit 1; }
mkdir -p "$out"
install -m 0644 "$istio/kubernetes/customresourcedefinitions.gen.yaml" "$out/istio.yaml"
for kind in gatewayclasses gateways; do
	install -m 0644 "$gateway/config/crd/standard/gateway.networking.k8s.io_$kind.yaml" "$out/gateway-api-$kind.yaml"
done
