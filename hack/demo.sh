#!/usr/bin/env bash
# make demo: a local cluster (canopy-local) with the sample app of
# deploy/examples, then what runs where. Reuses a running demo cluster.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:?OUT (the build directory) must be set; run make demo}
kubedir=$(hack/tools.sh kube)
export CANOPY_KUBE_BIN_DIR=$kubedir
export CANOPY_CNI_BIN_DIR=$(hack/tools.sh cni)
export CANOPY_COREDNS_BIN_DIR=$(hack/tools.sh coredns)
local=("$out/canopy-local" --name demo)
kubectl() { "$kubedir/kubectl" --kubeconfig /var/lib/canopy-local/demo/control-plane/admin.kubeconfig "$@"; }

if ! "${local[@]}" status >/dev/null 2>&1; then
	"${local[@]}" up --nodes 2 --echo "$out/canopy-echo"
fi
kubectl apply -f "$root/deploy/examples/echo.yaml"
kubectl -n demo rollout status deployment/echo --timeout=120s
kubectl -n demo rollout status deployment/client --timeout=120s

echo
echo "== nodes"
kubectl get nodes -o wide
echo
echo "== pods of the sample app"
kubectl -n demo get pods -o wide
echo
client=$(kubectl -n demo get pods -l app=client -o jsonpath='{.items[0].status.podIP}')
echo "== the client calls http://echo.demo (cluster DNS, then the Service VIP)"
"$out/canopy-echo" get "http://$client:8080/fetch?url=http://echo.demo/"
echo
echo
echo "== ambient workloads (canopyctl workloads arrives with the canopyctl issue; the local cluster's view for now)"
"${local[@]}" status
echo
echo "The cluster keeps running: export KUBECONFIG=/var/lib/canopy-local/demo/control-plane/admin.kubeconfig"
echo "and use $kubedir/kubectl. Remove it with: $out/canopy-local --name demo down"
