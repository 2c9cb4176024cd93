#!/usr/bin/env bash
# Installs the Debian packages that building and testing Canopy needs, only
# when a command is missing, so a second run does nothing.
set -euo pipefail

declare -A pkg_for=(
	[etcd]=etcd-server
	# kube-proxy's nftables mode drives the kernel through nft.
	[nft]=nftables
	# The CNI agent's iptables backend loads its rules with iptables-restore,
	# and their IPv6 twins with ip6tables-restore (same package).
	[iptables-restore]=iptables
	[ip6tables-restore]=iptables
	# The real nodes' containers: containerd's runc shim runs Debian's runc.
	[runc]=runc
	# Entering a real node's mount, UTS and network namespaces (util-linux,
	# essential in Debian; listed for minimal roots).
	[nsenter]=util-linux
)
# apt brings their libraries along (libnftables1, libnftnl11, libip6tc2,
# libnetfilter-conntrack3, libnfnetlink0): hack/fresh-machine-check.sh
# showed them arriving with nftables and iptables on a minimal root.
missing=()
for cmd in "${!pkg_for[@]}"; do
	command -v "$cmd" >/dev/null || missing+=("${pkg_for[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: missing ${missing[*]}: run as root or install them yourself" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
