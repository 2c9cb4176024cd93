#!/usr/bin/env bash
# make demo: a two-node local cluster of real nodes (canopy-local: a kubelet
# and containerd per node, images pulled from the cluster's registry),
# Canopy's images pushed there and installed from its Helm chart by
# canopyctl install (the components run as the chart's pods, service
# accounts and RBAC, each in its container), the sample app of
# deploy/examples, then what a user asks first: which workloads are in the
# mesh, and is their traffic carried over mutual TLS between the right
# identities; last, the proxyless gRPC sample in sidecar mode.
# Reuses a running demo cluster.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:?OUT (the build directory) must be set; run make demo}
version=${VERSION:?VERSION (the image tag) must be set; run make demo}
# Assigned before export: a failed build must stop the script (set -e).
kubedir=$("$root/hack/tools.sh" kube)
cnidir=$("$root/hack/tools.sh" cni)
corednsdir=$("$root/hack/tools.sh" coredns)
containerddir=$("$root/hack/tools.sh" containerd)
registrydir=$("$root/hack/tools.sh" registry)
# Istio's pilot-agent is the proxyv2 image the injector puts in pods.
istiodir=$("$root/hack/tools.sh" istio)
export CANOPY_KUBE_BIN_DIR=$kubedir CANOPY_CNI_BIN_DIR=$cnidir CANOPY_COREDNS_BIN_DIR=$corednsdir \
	CANOPY_CONTAINERD_BIN_DIR=$containerddir CANOPY_REGISTRY_BIN_DIR=$registrydir
state=/var/lib/canopy-local/demo
export KUBECONFIG=$state/control-plane/admin.kubeconfig
local=("$out/canopy-local" --name demo)
kubectl() { "$kubedir/kubectl" "$@"; }
canopyctl() { "$out/canopyctl" "$@"; }
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "local cluster: 2 real nodes (kubelet, containerd and runc in namespaces of their own)"
# A demo cluster of an earlier release ran the kubelet stand-in: start it
# again on real nodes.
if "${local[@]}" status >/dev/null 2>&1 && ! grep -qs '"runtime": "containerd"' "$state/state.json"; then
	echo "the running demo cluster has no real nodes; starting it again"
	"${local[@]}" down >/dev/null
fi
if ! "${local[@]}" status >/dev/null 2>&1; then
	"${local[@]}" up --nodes 2 --runtime containerd
else
	echo "reusing the running demo cluster"
fi
registry=$(sed -n 's/.*"registry": "\([^"]*\)".*/\1/p' "$state/state.json")
kubectl get nodes -o wide

step "images: Canopy's, the sample app's and Istio's agent, pushed to the cluster's registry $registry"
(cd "$root" && go run ./hack/images --bin-dir "$out" --out "$out/images" --tag "$version" \
	--push "$registry" --pilot-agent "$istiodir/pilot-agent")

step "canopyctl install (the Helm chart, images from $registry)"
canopyctl install -f "$root/deploy/examples/local-values.yaml" --set "image.hub=$registry/canopy" --version "$version"
kubectl -n istio-system get pods -o wide

step "sample app: client and echo in the ambient namespace demo, legacy outside the mesh"
kubectl apply -f "$root/deploy/examples/echo.yaml"
for d in demo/echo demo/client legacy/legacy; do
	kubectl -n "${d%/*}" rollout status "deployment/${d#*/}" --timeout=120s
done

# A rerun starts from the demo's beginning: no policy yet.
kubectl -n demo delete authorizationpolicy deny-outside-demo --ignore-not-found >/dev/null

step "canopyctl workloads"
canopyctl workloads

step "traffic: the client calls http://echo.demo, each call on a new connection"
# Through port-forwards, as kubectl reaches pods: the calls start inside
# the pods, and only the pods' own traffic shows up below.
pf=()
trap 'kill "${pf[@]}" 2>/dev/null || true' EXIT
"$kubedir/kubectl" -n demo port-forward deployment/client 18080:8080 >/dev/null & pf+=($!)
"$kubedir/kubectl" -n legacy port-forward deployment/legacy 18081:8080 >/dev/null & pf+=($!)
for port in 18080 18081; do
	for _ in $(seq 50); do "$out/canopy-echo" get "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
done
# fetch asks the pod behind a port-forward to GET http://echo.demo/ and
# prints which echo pod answered. A Service that just got its endpoints
# reaches each node's kube-proxy a moment later: retry for a few seconds,
# as a client would.
fetch() {
	local i body
	for i in $(seq 20); do
		if body=$("$out/canopy-echo" get "http://127.0.0.1:$1/fetch?url=http://echo.demo/" 2>/dev/null); then
			echo "$body" | sed -n 's/.*"hostname":"\([^"]*\)".*/answered by \1/p'
			return 0
		fi
		sleep 0.5
	done
	"$out/canopy-echo" get "http://127.0.0.1:$1/fetch?url=http://echo.demo/"
}
# The node proxy picks an echo pod per connection at random: six calls
# usually reach both, and a few more make sure they do.
answered=()
for i in $(seq 20); do
	[ "$i" -gt 6 ] && [ "$(printf '%s\n' "${answered[@]}" | sort -u | wc -l)" -ge 2 ] && break
	printf 'call %d: ' "$i"
	line=$(fetch 18080)
	echo "$line"
	answered+=("$line")
done
printf 'legacy (outside the mesh): '; fetch 18081

step "canopyctl traffic: who talked to whom, as which identity, over what"
# Node proxies count a connection when it opens; give the last a moment.
sleep 1
canopyctl traffic
traffic=$(canopyctl traffic)
if ! grep -q 'destination.*demo/client.*demo/echo.*spiffe://cluster.local/ns/demo/sa/client.*spiffe://cluster.local/ns/demo/sa/echo.*mutual_tls' <<<"$traffic"; then
	echo "demo: client -> echo was not carried over mutual TLS between the client and echo identities" >&2
	exit 1
fi
nodes=$(awk '$2 == "destination" && $4 == "demo/echo" && $0 ~ /demo\/client/ {print $1}' <<<"$traffic" | sort -u | wc -l)
echo
echo "client -> echo went over mutual TLS, spiffe://cluster.local/ns/demo/sa/client to"
echo "spiffe://cluster.local/ns/demo/sa/echo, as the node proxies of the echo pods on"
echo "$nodes node(s) verified; the legacy pod, outside the mesh, reached echo in"
echo "plaintext (security none)."
if [ "$nodes" -lt 2 ]; then
	echo "demo: the client's connections reached echo pods on $nodes node(s), want both" >&2
	exit 1
fi

step "an AuthorizationPolicy: echo refuses every caller outside the demo namespace"
kubectl apply -f "$root/deploy/examples/deny-outside-demo.yaml"
# The policy reaches the node proxies over xDS within a moment: call until
# the legacy pod is refused (the first calls may still pass).
refused=
for _ in $(seq 20); do
	if ! "$out/canopy-echo" get "http://127.0.0.1:18081/fetch?url=http://echo.demo/" >/dev/null 2>&1; then
		refused=1
		break
	fi
	sleep 0.5
done
[ -n "$refused" ] || { echo "demo: the legacy pod was never refused" >&2; exit 1; }
echo "legacy -> echo: refused"
printf 'client -> echo: '; fetch 18080
sleep 1
canopyctl traffic --denied
if ! canopyctl traffic --denied | grep -q 'destination.*legacy/legacy.*demo/echo'; then
	echo "demo: the refused connection from legacy/legacy to demo/echo is not shown as denied" >&2
	exit 1
fi

step "proxyless gRPC: sidecar mode, injected by canopy-controller, run by Istio's own agent"
# The namespace asks for injection; each pod asks for the grpc-agent
# template: Istio's pilot-agent (the proxyv2 image) gets the pod's
# certificate from Canopy's CA and proxies canopy-controller's xDS to the
# app, canopy-echo's gRPC mode, which takes routes, mutual TLS and policy
# from it through grpc-go's xDS support.
kubectl apply -f "$root/deploy/examples/grpc.yaml"
for d in echo-grpc-v1 echo-grpc-v2 client intruder; do
	kubectl -n grpc-demo rollout status "deployment/$d" --timeout=180s
done
canopyctl workloads -n grpc-demo
"$kubedir/kubectl" -n grpc-demo port-forward deployment/client 18082:8080 >/dev/null & pf+=($!)
"$kubedir/kubectl" -n grpc-demo port-forward deployment/intruder 18083:8080 >/dev/null & pf+=($!)
target=xds:///echo-grpc.grpc-demo.svc.cluster.local:7070
grpc() { "$out/canopy-echo" get "http://127.0.0.1:$1/grpc?n=$2&target=$target"; }
for _ in $(seq 60); do grpc 18082 1 2>/dev/null | grep -q '"code":"OK"' && break; sleep 0.5; done
calls=$(grpc 18082 50)
v1=$(grep -o '"version":"v1"' <<<"$calls" | wc -l)
v2=$(grep -o '"version":"v2"' <<<"$calls" | wc -l)
peer=$(grep -o '"peerPrincipal":"[^"]*"' <<<"$calls" | sort -u | cut -d'"' -f4)
echo "client -> echo-grpc: 50 calls, $v1 answered by v1 and $v2 by v2 (VirtualService: 80/20);"
echo "  the servers saw the caller as $peer over mutual TLS"
if [ "$((v1 + v2))" -ne 50 ] || [ "$peer" != "spiffe://cluster.local/ns/grpc-demo/sa/client" ]; then
	echo "demo: proxyless calls failed or did not carry the client's identity:" >&2
	echo "$calls" >&2
	exit 1
fi
denied=$(grpc 18083 1)
code=$(grep -o '"code":"[^"]*"' <<<"$denied" | cut -d'"' -f4)
if [ "$code" != PermissionDenied ]; then
	echo "demo: the intruder was not refused: $denied" >&2
	exit 1
fi
echo "intruder -> echo-grpc: $code, by the AuthorizationPolicy deny-intruder (enforced in the server)"
canopyctl proxy-status

step "explore"
cat <<EOF
export KUBECONFIG=$KUBECONFIG
export PATH=$out:$kubedir:\$PATH   # canopyctl, canopy-local and kubectl
canopyctl workloads -o wide      # also: services, policies, certificates, proxy-status, traffic
canopyctl config-dump node       # a node proxy's whole view; config-dump controller for the tables
canopyctl traffic --denied       # the refused connections, with source and destination
kubectl get pods -A -o wide
kubectl -n demo delete authorizationpolicy deny-outside-demo   # let the legacy pod in again
kubectl -n grpc-demo delete authorizationpolicy deny-intruder   # let the gRPC intruder in
kubectl apply -f - <<'YAML'  # refuse plaintext into the demo namespace
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: demo}
spec: {mtls: {mode: STRICT}}
YAML

Tear down: make demo-down
EOF
