// Package e2e holds Canopy's end-to-end suite: the local cluster (two
// nodes as network namespaces, a kubelet stand-in running processes, the
// nodes registered with the CNI agent's startup taint), the sample app of
// deploy/examples applied first, Canopy installed from the Helm chart by
// canopyctl's install, and assertions on what users see (canopyctl's
// tables) and on real traffic. It needs root; make test runs it.
package e2e
