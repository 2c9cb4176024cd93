#!/usr/bin/env bash
# Builds the third-party binaries that Canopy's tests and local cluster run,
# each pinned in its own Go module under tools/, into a cache outside the
# repo, and prints the directory that holds them:
#
#   hack/tools.sh kube      kube-apiserver, kube-controller-manager, kube-proxy, kubectl,
#                           kubelet and kube-scheduler (the real nodes)
#   hack/tools.sh coredns   coredns (cluster DNS)
#   hack/tools.sh cni       ptp, host-local, loopback (CNI reference plugins)
#   hack/tools.sh buf       buf (compiles, lints and checks the protos)
#   hack/tools.sh istio     pilot-discovery (istiod), istioctl (the parity test's reference),
#                           pilot-agent (the proxyv2 image's agent on the local cluster)
#   hack/tools.sh containerd containerd, containerd-shim-runc-v2, ctr (the real nodes' runtime)
#   hack/tools.sh registry  registry (distribution: the OCI registry the real nodes pull from)
#   hack/tools.sh helm      helm (the CLI the chart's test installs, upgrades and uninstalls with)
#
# A cold build prints what it builds and how long that took cold; Go's own
# output goes to a log in the cache and is shown only when a build fails.
# A module's binaries build in one go command, which links one while it
# compiles the next: on 2 cores that is faster than one command each.
#
# The directory is keyed by the module's version pin and a hash of its files,
# ldflags and binaries: a second run reuses the binaries, a changed pin
# rebuilds them. Go's build cache makes a rebuild after an unrelated change
# a relink, not a full build.
set -euo pipefail

name=${1:?usage: hack/tools.sh kube|coredns|cni|buf|istio|containerd|registry|helm}
root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/tools/$name"
[ -f "$mod/go.mod" ] || { echo "tools: no module tools/$name" >&2; exit 1; }

# pin is a module's version in go.mod, on a require line or in a block.
pin() {
	awk -v m="$1" '$1 == "require" && $2 == m {print $3} $1 == m && $2 ~ /^v/ {print $2}' "$mod/go.mod" | head -n 1
}
ldflags="-s -w"
# cold says what a cold build of the module's binaries costs on 2 cores
# (measured with a warm module cache and nothing else running).
cold="a minute or two"
case "$name" in
kube)
	version=$(pin k8s.io/kubernetes)
	minor=${version#v1.}; minor=${minor%%.*}
	v=k8s.io/component-base/version
	# Clients parse the server's version; without these it is unparseable.
	ldflags="$ldflags -X $v.gitVersion=$version -X $v.gitMajor=1 -X $v.gitMinor=$minor
		-X $v.gitCommit=0000000000000000000000000000000000000000 -X $v.gitTreeState=clean
		-X $v.buildDate=1970-01-01T00:00:00Z"
	cold="about 9 minutes"
	binaries=(
		"kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver"
		"kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager"
		"kube-proxy k8s.io/kubernetes/cmd/kube-proxy"
		"kubectl k8s.io/kubernetes/cmd/kubectl"
		"kubelet k8s.io/kubernetes/cmd/kubelet"
		"kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler"
	)
	;;
coredns)
	version=$(pin github.com/coredns/coredns)
	cold="about 2 minutes"
	binaries=("coredns github.com/coredns/coredns")
	;;
cni)
	version=$(pin github.com/containernetworking/plugins)
	p=github.com/containernetworking/plugins/plugins
	cold="seconds"
	binaries=("ptp $p/main/ptp" "loopback $p/main/loopback" "host-local $p/ipam/host-local")
	;;
buf)
	version=$(pin github.com/bufbuild/buf)
	cold="about 2 minutes"
	binaries=("buf github.com/bufbuild/buf/cmd/buf")
	;;
istio)
	version=$(pin istio.io/istio)
	v=istio.io/istio/pkg/version
	# istiod reports this version to proxies and istioctl prints it.
	ldflags="$ldflags -X $v.buildVersion=$version -X $v.buildGitRevision=${version##*-}
		-X $v.buildStatus=Clean -X $v.buildTag=$version"
	cold="about 5 minutes"
	binaries=(
		"pilot-discovery istio.io/istio/pilot/cmd/pilot-discovery"
		"istioctl istio.io/istio/istioctl/cmd/istioctl"
		"pilot-agent istio.io/istio/pilot/cmd/pilot-agent"
	)
	;;
containerd)
	version=$(pin github.com/containerd/containerd/v2)
	# Without it containerd reports "<version>+unknown" to the kubelet.
	ldflags="$ldflags -X github.com/containerd/containerd/v2/version.Version=$version
		-X github.com/containerd/containerd/v2/version.Revision=canopy-tools"
	cold="about a minute and a half"
	binaries=(
		"containerd github.com/containerd/containerd/v2/cmd/containerd"
		"containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
		"ctr github.com/containerd/containerd/v2/cmd/ctr"
	)
	;;
registry)
	version=$(pin github.com/distribution/distribution/v3)
	cold="about a minute and a half"
	binaries=("registry github.com/distribution/distribution/v3/cmd/registry")
	;;
helm)
	version=$(pin helm.sh/helm/v4)
	# helm version prints it; charts may require a helm version.
	ldflags="$ldflags -X helm.sh/helm/v4/internal/version.version=$version"
	cold="about 2 minutes"
	binaries=("helm helm.sh/helm/v4/cmd/helm")
	;;
*)
	echo "tools: unknown tool module $name" >&2
	exit 1
	;;
esac
[ -n "$version" ] || { echo "tools: no version pin in $mod/go.mod" >&2; exit 1; }

# The cache key is what goes into the binaries: the module's files, the
# ldflags and the list of binaries (not this script's wording).
shopt -s nullglob
key=$( (cat "$mod/go.mod" "$mod/go.sum" "$mod"/*.go; echo "$ldflags"; printf '%s\n' "${binaries[@]}") | sha256sum | cut -c1-12)
out="${CANOPY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/canopy}/$name/$version-$key"

# One build at a time per module: concurrent test packages and scripts
# wait for the first one instead of building the same binaries again.
mkdir -p "$(dirname "$out")"
exec 9>"$(dirname "$out")/.lock"
flock 9
todo=()
for entry in "${binaries[@]}"; do
	read -r bin _ <<<"$entry"
	[ -x "$out/$bin" ] || todo+=("$entry")
done
if [ ${#todo[@]} -gt 0 ]; then
	mkdir -p "$out"
	log="$out/build.log"
	: >"$log"
	# A new build supersedes older ones of this module: keep the cache small.
	find "$(dirname "$out")" -mindepth 1 -maxdepth 1 -type d ! -path "$out" -exec rm -rf {} +
	start=$SECONDS
	echo "tools: $name $version: fetching its Go modules" >&2
	(cd "$mod" && go mod download) >>"$log" 2>&1 || { cat "$log" >&2; exit 1; }
	bins=() pkgs=()
	for entry in "${todo[@]}"; do
		read -r bin pkg <<<"$entry"
		bins+=("$bin") pkgs+=("$pkg")
	done
	echo "tools: $name $version: building ${bins[*]} (cold: $cold on 2 idle cores; longer beside other builds)" >&2
	# go build -o names each binary after its package's last element, which
	# is how binaries names them; a failed build leaves none in $out.
	tmp="$out/.build"
	rm -rf "$tmp" && mkdir -p "$tmp"
	if ! (cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}") >>"$log" 2>&1; then
		echo "tools: building ${bins[*]} failed:" >&2
		cat "$log" >&2
		exit 1
	fi
	for bin in "${bins[@]}"; do
		mv "$tmp/$bin" "$out/$bin"
	done
	rmdir "$tmp"
	echo "tools: $name $version ready in $((SECONDS - start)) s" >&2
fi
echo "$out"
