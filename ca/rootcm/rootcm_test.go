package rootcm_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/canopy-mesh/canopy/ca/rootcm"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func TestRootConfigMapsPublishedAndRepaired(t *testing.T) {
	testenv.Need(t, env)
	ctx := t.Context()
	const rootA, rootsAB = "-----ROOT A-----\n", "-----ROOT A-----\n-----ROOT B-----\n"
	p, err := rootcm.New(env.Client, []byte(rootA), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	cms := func(ns string) (*corev1.ConfigMap, error) {
		return env.Client.CoreV1().ConfigMaps(ns).Get(ctx, rootcm.ConfigMapName, metav1.GetOptions{})
	}
	waitFor := func(what, ns, want string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			cm, err := cms(ns)
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil && cm.Data[rootcm.Key] == want && len(cm.Data) == 1, err
		})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	waitFor("existing namespace", "default", rootA)
	ns := env.Namespace(t, "fresh", nil)
	waitFor("new namespace", ns, rootA)

	cm, _ := cms(ns)
	cm.Data = map[string]string{rootcm.Key: "tampered", "extra": "x"}
	if _, err := env.Client.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("edited configmap repaired", ns, rootA)

	if err := env.Client.CoreV1().ConfigMaps(ns).Delete(ctx, rootcm.ConfigMapName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("deleted configmap recreated", ns, rootA)

	p.SetBundle([]byte(rootsAB))
	waitFor("rotation bundle reaches every namespace", ns, rootsAB)
	waitFor("rotation bundle reaches every namespace", "default", rootsAB)
}
