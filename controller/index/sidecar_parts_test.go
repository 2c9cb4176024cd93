package index

import (
	"testing"

	securityapi "istio.io/api/security/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
)

// TestSidecarInputsChanged: an update reports a change of what sidecar
// xDS reads exactly when the object's sidecar part changed. Before, a
// pod's relabelling (a DestinationRule subset's members) and a
// PeerAuthentication's mode reached no sidecar until something else
// changed.
func TestSidecarInputsChanged(t *testing.T) {
	x := New(ambient.Config{})
	v1 := map[string]string{"app": "echo", "version": "v1"}
	v2 := map[string]string{"app": "echo", "version": "v2"}
	notReady := pod("a", "n1", v1, "10.244.1.5")
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	terminating := pod("a", "n1", v2, "10.244.1.5")
	terminating.DeletionTimestamp = &metav1.Time{}
	labelled := service("echo", map[string]string{"app": "echo"})
	labelled.Labels = map[string]string{"team": "x"}
	renamed := service("echo", map[string]string{"app": "echo"})
	renamed.Spec.Ports[0].Name = "http"
	mode := func(m securityapi.PeerAuthentication_MutualTLS_Mode) *securityv1.PeerAuthentication {
		pa := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "istio-system"}}
		pa.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: m}
		return pa
	}
	audit := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "audit", Namespace: "shop"}}
	audit.Spec.Action = securityapi.AuthorizationPolicy_AUDIT
	vm := func(lbls map[string]string, address string) *networkingv1.WorkloadEntry {
		we := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "shop"}}
		we.Spec.Labels, we.Spec.Address = lbls, address
		return we
	}
	for _, tt := range []struct {
		name   string
		update func() ChangeSet
		want   bool
	}{
		{"a pod", func() ChangeSet { return x.UpsertPod(pod("a", "n1", v1, "10.244.1.5")) }, true},
		{"its readiness (the table says)", func() ChangeSet { return x.UpsertPod(notReady) }, false},
		{"its labels", func() ChangeSet { return x.UpsertPod(pod("a", "n1", v2, "10.244.1.5")) }, true},
		{"it terminates", func() ChangeSet { return x.UpsertPod(terminating) }, true},
		{"it goes", func() ChangeSet { return x.DeletePod("shop", "a") }, true},
		{"a pod never seen goes", func() ChangeSet { return x.DeletePod("shop", "b") }, false},
		{"a Service", func() ChangeSet { return x.UpsertService(service("echo", map[string]string{"app": "echo"})) }, true},
		{"its labels", func() ChangeSet { return x.UpsertService(labelled) }, false},
		{"its port's protocol", func() ChangeSet { return x.UpsertService(renamed) }, true},
		{"a PeerAuthentication", func() ChangeSet {
			return x.UpsertPeerAuthentication(mode(securityapi.PeerAuthentication_MutualTLS_STRICT))
		}, true},
		{"its mode", func() ChangeSet {
			return x.UpsertPeerAuthentication(mode(securityapi.PeerAuthentication_MutualTLS_PERMISSIVE))
		}, true},
		{"it goes", func() ChangeSet { return x.DeletePeerAuthentication("istio-system", "default") }, true},
		{"an AUDIT policy", func() ChangeSet { return x.UpsertAuthorizationPolicy(audit) }, true},
		{"a WorkloadEntry", func() ChangeSet { return x.UpsertWorkloadEntry(vm(v1, "10.5.0.1")) }, true},
		{"its address (the table says)", func() ChangeSet { return x.UpsertWorkloadEntry(vm(v1, "10.5.0.2")) }, false},
		{"its labels", func() ChangeSet { return x.UpsertWorkloadEntry(vm(v2, "10.5.0.2")) }, true},
		{"a namespace", func() ChangeSet {
			return x.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
		}, false},
		{"a node", func() ChangeSet { return x.UpsertNode(node("n1", "z1")) }, false},
	} {
		if got := tt.update().SidecarInputs; got != tt.want {
			t.Errorf("%s: SidecarInputs %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestKeysReadAreRecorded: what an update of a namespace or node compares
// is what the builders read of it, learnt from their reads: a key no
// build reads recomputes nothing, a key one reads does.
func TestKeysReadAreRecorded(t *testing.T) {
	x := New(ambient.Config{})
	x.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	x.UpsertNode(node("n1", "z1"))
	x.UpsertPod(pod("a", "n1", nil, "10.244.1.5"))
	x.UpsertService(service("echo", nil))

	if got, want := x.nodeReads["n1"].labels, map[string]bool{
		corev1.LabelTopologyRegion: true, corev1.LabelTopologyZone: true, ambient.LabelSubzone: true,
	}; !equalSets(got, want) {
		t.Errorf("node keys read %v, want %v", got, want)
	}
	// A pod reads use-waypoint (not set: not its namespace); a Service
	// also the traffic distribution annotation.
	if got := x.namespaceReads["shop"]; !got.labels[ambient.LabelUseWaypoint] || !got.annotations[ambient.AnnotationTrafficDistribution] {
		t.Errorf("namespace keys read: labels %v, annotations %v", got.labels, got.annotations)
	}
	if x.namespaceReads["shop"].labels["team"] {
		t.Error("a key no builder reads is recorded")
	}
	check(t, "a label no build reads", x.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop",
		Labels: map[string]string{"team": "x"}}}), ChangeSet{})
	check(t, "a node label no build reads", x.UpsertNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
		Labels: map[string]string{corev1.LabelTopologyZone: "z1", "heartbeat": "2"}}}), ChangeSet{})
	check(t, "a node label a build reads", x.UpsertNode(node("n1", "z2")), addr(nil, []string{podA}, nil))
	annotated := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"team": "x"},
		Annotations: map[string]string{ambient.AnnotationTrafficDistribution: "PreferSameZone"}}}
	check(t, "an annotation a build reads", x.UpsertNamespace(annotated), addr(nil, []string{svc}, nil))
	// A record lasts while something reads it.
	x.DeletePod("shop", "a")
	x.DeleteNode("n1")
	if _, ok := x.nodeReads["n1"]; ok {
		t.Error("the record of a deleted node no pod is on stays")
	}
}

func equalSets(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
