#!/usr/bin/env bash
# Proves the README contract on a clean root filesystem: a minimal Debian
# (debootstrap --variant=minbase, from Debian's own packages) plus only the
# packages a fresh machine is assumed to have (hack/fresh-machine/base-packages),
# then `.ci/run` (hack/install-deps.sh and `make test` with CI=true) on a clean
# clone of HEAD. A package that the build or the tests need and that neither
# list names makes this fail.
#
# Go itself is the machine's (/usr/local/go, bind-mounted read-only), and the
# Go module and build caches and $CANOPY_CACHE are shared with this machine, so
# the run checks Debian packages and files, not cold Go builds; warm, it takes
# about as long as `make test`. The tests run in a network namespace of their
# own, so nothing collides with what runs on this machine.
#
#   hack/fresh-machine-check.sh            # rootfs cached in $CANOPY_CACHE/fresh-machine
#   hack/fresh-machine-check.sh --prepare  # only build the cached root filesystem
#   hack/fresh-machine-check.sh --shell    # a shell in the prepared root instead of the tests
#   FRESH_KEEP=1 hack/fresh-machine-check.sh   # keep the root filesystem afterwards
#   FRESH_CMD='make test GOTESTFLAGS=-run=TestX' hack/fresh-machine-check.sh   # another command than .ci/run
#
# A one-off check, run by hand and reported in the issue notes; it is not part
# of `make test` (CI has no time for it).
set -euo pipefail

[ "$(id -u)" -eq 0 ] || { echo "fresh-machine-check: run as root" >&2; exit 1; }
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${CANOPY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/canopy}
suite=bookworm
dir="$cache/fresh-machine"
base="$dir/$suite-minbase.tar"
root="$dir/root"
mode=${1:-test}

# The mirror is the one this machine's apt already uses.
mirror=$(awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}' \
	/etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || { echo "fresh-machine-check: no Debian mirror in /etc/apt sources" >&2; exit 1; }

mkdir -p "$dir"
if [ ! -f "$base" ]; then
	command -v debootstrap >/dev/null || {
		echo "fresh-machine-check: installing debootstrap" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
	}
	pkgs=$(grep -v '^#' "$repo/hack/fresh-machine/base-packages" | awk 'NF {print $1}' | paste -sd, -)
	echo "fresh-machine-check: debootstrap $suite (minbase + $pkgs), cached in $base" >&2
	tmp="$dir/build.$$"
	rm -rf "$tmp"
	debootstrap --variant=minbase --include="$pkgs" "$suite" "$tmp" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
		{ echo "fresh-machine-check: debootstrap failed; see $dir/debootstrap.log" >&2; exit 1; }
	tar -C "$tmp" -cf "$base.tmp" .
	mv "$base.tmp" "$base"
	rm -rf "$tmp"
fi

[ "$mode" = --prepare ] && { echo "fresh-machine-check: $base is ready" >&2; exit 0; }

cleanup() {
	# Mounts live in the check's own mount namespace and end with it.
	[ "${FRESH_KEEP:-}" = 1 ] || rm -rf "$root"
}
trap cleanup EXIT
rm -rf "$root"
mkdir -p "$root"
tar -C "$root" -xf "$base"
cp /etc/resolv.conf "$root/etc/resolv.conf"

# A clean clone of HEAD, as CI makes.
git clone -q --no-hardlinks "$repo" "$root/src/canopy"
git -C "$root/src/canopy" checkout -q "$(git -C "$repo" rev-parse HEAD)"

gomodcache=$(go env GOMODCACHE)
gocache=$(go env GOCACHE)
mkdir -p "$gomodcache" "$gocache" "$cache"
for d in usr/local/go cache/gomod cache/gobuild cache/canopy; do mkdir -p "$root/$d"; done

# inside runs a command in the root with the shared caches and Go mounted,
# as root with a fresh machine's environment.
inside() {
	local net=$1
	shift
	unshare --mount --propagation private $net -- bash -euo pipefail -c '
		root=$1 gomodcache=$2 gocache=$3 cache=$4; shift 4
		# The root must be a mount point, as on a machine: the local
		# cluster makes every mount below "/" a slave of the host.
		mount --bind "$root" "$root"
		mount --rbind /dev "$root/dev"
		mount -t proc proc "$root/proc"
		mount -t sysfs sysfs "$root/sys"
		mount -t cgroup2 cgroup2 "$root/sys/fs/cgroup" 2>/dev/null || true
		mount -t tmpfs tmpfs "$root/run"
		mount -t tmpfs tmpfs "$root/tmp"
		mount --bind -o ro /usr/local/go "$root/usr/local/go"
		mount --bind "$gomodcache" "$root/cache/gomod"
		mount --bind "$gocache" "$root/cache/gobuild"
		mount --bind "$cache" "$root/cache/canopy"
		ip link set lo up 2>/dev/null || true
		exec chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb \
			PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			GOMODCACHE=/cache/gomod GOCACHE=/cache/gobuild CANOPY_CACHE=/cache/canopy \
			GOFLAGS="${GOFLAGS:-}" CI=true \
			bash -c "cd /src/canopy && $*"
	' inside "$root" "$gomodcache" "$gocache" "$cache" "$@"
}

echo "fresh-machine-check: packages before: $(chroot "$root" dpkg-query -W -f='.' | wc -c)" >&2
# With the network: what .ci/run installs, and the Go modules (warm here).
inside "" 'hack/install-deps.sh && go mod download && for m in tools/*/; do (cd "$m" && go mod download); done'
echo "fresh-machine-check: packages after install-deps: $(chroot "$root" dpkg-query -W -f='${Package}\n' | wc -l)" >&2

if [ "$mode" = --shell ]; then
	inside --net 'exec bash -i'
	exit 0
fi
# The tests run without the network (modules come from the cache) in a
# network namespace of their own.
start=$(date +%s)
if inside --net "GOPROXY=off ${FRESH_CMD:-.ci/run}"; then
	echo "fresh-machine-check: PASS: ${FRESH_CMD:-.ci/run} on a clean $suite root in $(( $(date +%s) - start )) s" >&2
else
	rc=$?
	echo "fresh-machine-check: FAIL ($rc) after $(( $(date +%s) - start )) s" >&2
	exit "$rc"
fi
