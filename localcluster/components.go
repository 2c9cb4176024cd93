package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/canopy-mesh/canopy/localcluster/kubelet"
	"github.com/canopy-mesh/canopy/localcluster/scheduler"
)

// RunKubelet runs a node's kubelet stand-in from the configuration file Up
// wrote, until ctx ends. Up starts it inside the node's network namespace.
func RunKubelet(ctx context.Context, configPath string, log *slog.Logger) error {
	b, err := os.ReadFile(configPath)
	if err != nil {
		return fmt.Errorf("read kubelet config: %w", err)
	}
	var kc KubeletConfig
	if err := json.Unmarshal(b, &kc); err != nil {
		return fmt.Errorf("parse kubelet config %s: %w", configPath, err)
	}
	client, err := clientFor(kc.Kubeconfig)
	if err != nil {
		return err
	}
	kc.Kubelet.Client = client
	kc.Kubelet.Log = log
	return kubelet.Run(ctx, kc.Kubelet, kc.Node)
}

// RunScheduler runs the cluster's scheduler until ctx ends.
func RunScheduler(ctx context.Context, kubeconfig string, log *slog.Logger) error {
	client, err := clientFor(kubeconfig)
	if err != nil {
		return err
	}
	s, err := scheduler.New(client, log)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

func clientFor(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	rc.QPS, rc.Burst = 50, 100
	return kubernetes.NewForConfig(rc)
}
