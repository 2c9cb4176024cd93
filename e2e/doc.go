// Package e2e holds Canopy's end-to-end suite: the local cluster (two
// nodes as network namespaces, a kubelet stand-in running processes),
// Canopy installed from the Helm chart by canopyctl's install, the sample
// app of deploy/examples, and assertions on what users see (canopyctl's
// tables) and on real traffic. It needs root; make test runs it.
package e2e
