// Package kubeconfig loads the client configuration a component talks to
// the API server with: a kubeconfig file when one is given, else the
// in-cluster service account.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Load returns the configuration from path, or the in-cluster one when
// path is empty.
func Load(path string) (*rest.Config, error) {
	if path != "" {
		c, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig %s: %w", path, err)
		}
		return c, nil
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster configuration (pass --kubeconfig outside a cluster): %w", err)
	}
	return c, nil
}
