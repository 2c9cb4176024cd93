package vipalloc_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"testing"
	"time"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/controller/ambient"
	"github.com/canopy-mesh/canopy/controller/vipalloc"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// settle is how long an allocation may take to show.
const settle = 20 * time.Second

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// start runs a Controller until the returned stop is called (or the test
// ends).
func start(t *testing.T, client istioclient.Interface) (stop func()) {
	t.Helper()
	c, err := vipalloc.New(client, vipalloc.DefaultRanges(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func dnsEntry(name, host string) *networkingv1.ServiceEntry {
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: name}}
	se.Spec.Hosts = []string{host}
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "https", Protocol: "TLS"}}
	se.Spec.Resolution = networkingapi.ServiceEntry_DNS
	return se
}

// TestControllerAllocates runs the allocator against a real API server:
// entries without addresses get one address of each range per host in
// status; addresses already in status are kept, across a restart too; an
// entry that opts out loses them; an address a user gives another entry is
// given up; and a write from a stale view is refused.
func TestControllerAllocates(t *testing.T) {
	testenv.Need(t, env)
	ctx := t.Context()
	client, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t, "vipalloc", nil)
	entries := client.NetworkingV1().ServiceEntries(ns)
	get := func(name string) *networkingv1.ServiceEntry {
		t.Helper()
		se, err := entries.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return se
	}
	create := func(se *networkingv1.ServiceEntry) {
		t.Helper()
		if _, err := entries.Create(ctx, se, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch := func(name string, p any, subresources ...string) error {
		data, _ := json.Marshal(p)
		_, err := entries.Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{}, subresources...)
		return err
	}
	ranges := vipalloc.DefaultRanges()
	// allocated reports an entry's status addresses when they are one
	// IPv4 and one IPv6 address of the ranges for host.
	allocated := func(name, host string) (v4, v6 string, ok bool) {
		as := get(name).Status.GetAddresses()
		if len(as) != 2 || as[0].GetHost() != host || as[1].GetHost() != host {
			return "", "", false
		}
		a4, err4 := netip.ParseAddr(as[0].GetValue())
		a6, err6 := netip.ParseAddr(as[1].GetValue())
		if err4 != nil || err6 != nil || !ranges.IPv4.Contains(a4) || !ranges.IPv6.Contains(a6) {
			return "", "", false
		}
		return as[0].GetValue(), as[1].GetValue(), true
	}

	// An entry whose status already holds addresses before the controller
	// starts (from an earlier run).
	create(dnsEntry("kept", "kept.example.com"))
	keptStatus := map[string]any{"status": map[string]any{"addresses": []map[string]string{
		{"host": "kept.example.com", "value": "240.240.7.7"}, {"host": "kept.example.com", "value": "2001:2::7:7"},
	}}}
	if err := patch("kept", keptStatus, "status"); err != nil {
		t.Fatal(err)
	}
	keptVersion := get("kept").ResourceVersion

	stop := start(t, client)
	create(dnsEntry("api", "api.example.com"))
	var apiV4, apiV6 string
	eventually.Within(t, settle, "api gets an IPv4 and an IPv6 address", func() bool {
		var ok bool
		apiV4, apiV6, ok = allocated("api", "api.example.com")
		return ok
	})
	if apiV4 == "240.240.7.7" || apiV6 == "2001:2::7:7" {
		t.Errorf("api got kept's address: %s, %s", apiV4, apiV6)
	}

	create(func() *networkingv1.ServiceEntry {
		se := dnsEntry("none", "none.example.com")
		se.Spec.Resolution = networkingapi.ServiceEntry_NONE
		return se
	}())
	optOut := map[string]any{"metadata": map[string]any{"labels": map[string]string{ambient.LabelEnableAutoallocateIP: "false"}}}
	if err := patch("api", optOut); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "an entry that opts out loses its addresses", func() bool {
		return len(get("api").Status.GetAddresses()) == 0
	})
	optIn := map[string]any{"metadata": map[string]any{"labels": map[string]any{ambient.LabelEnableAutoallocateIP: nil}}}
	if err := patch("api", optIn); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "opted back in, it gets the same addresses (the allocation is deterministic)", func() bool {
		v4, v6, ok := allocated("api", "api.example.com")
		return ok && v4 == apiV4 && v6 == apiV6
	})

	// A restart reads every status before it allocates: nothing moves.
	stop()
	apiVersion := get("api").ResourceVersion
	start(t, client)
	create(dnsEntry("after", "after.example.com"))
	eventually.Within(t, settle, "the restarted controller allocates", func() bool {
		_, _, ok := allocated("after", "after.example.com")
		return ok
	})
	if v := get("kept").ResourceVersion; v != keptVersion {
		t.Errorf("kept's status was rewritten: %v", get("kept").Status.GetAddresses())
	}
	if v := get("api").ResourceVersion; v != apiVersion {
		t.Errorf("api's status was rewritten after the restart: %v", get("api").Status.GetAddresses())
	}
	if n := len(get("none").Status.GetAddresses()); n != 0 {
		t.Errorf("an entry with resolution NONE got %d addresses", n)
	}

	// A user gives api's IPv4 address to another entry: api gives it up.
	user := dnsEntry("user", "user.example.com")
	user.Spec.Addresses = []string{apiV4}
	create(user)
	eventually.Within(t, settle, "api moves off the address a user gave another entry", func() bool {
		v4, v6, ok := allocated("api", "api.example.com")
		return ok && v4 != apiV4 && v6 == apiV6
	})

	// The controller's writes carry the resourceVersion they were computed
	// from; one from a stale view is refused.
	stale := map[string]any{
		"metadata": map[string]any{"resourceVersion": keptVersion},
		"status":   map[string]any{"addresses": nil},
	}
	if err := patch("kept", map[string]any{"metadata": map[string]any{"labels": map[string]string{"touched": "yes"}}}); err != nil {
		t.Fatal(err)
	}
	if err := patch("kept", stale, "status"); !apierrors.IsConflict(err) {
		t.Errorf("status patch with a stale resourceVersion: %v, want a conflict", err)
	}
}
