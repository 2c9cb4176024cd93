// Package testenv runs a real Kubernetes control plane for tests: etcd (from
// the system), kube-apiserver and kube-controller-manager (built from the
// Kubernetes Go module pinned in tools/kube), all on loopback with free ports.
//
// The API server runs with RBAC, a static admin token and a service-account
// signing key, so TokenRequest and TokenReview work as in a real cluster. The
// controller manager runs the endpointslice, endpointslicemirroring,
// serviceaccount, serviceaccount-token, namespace, garbagecollector,
// deployment and replicaset controllers. There is no kubelet and no
// scheduler: pods stay Pending until a test patches their status.
//
// A test package starts one environment in TestMain:
//
//	var env *testenv.Environment
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }
//
//	func TestSomething(t *testing.T) {
//		testenv.Need(t, env)
//		ns := env.Namespace(t, "something")
//		...
//	}
//
// When a prerequisite is missing (etcd, or the Kubernetes binaries cannot be
// built) the tests skip, except under CI where they fail. Components' logs
// are kept, and their directory printed, when a test fails.
//
// Only tests and test tooling import this package. An Environment is safe
// for concurrent use by parallel tests once started.
package testenv
