// Package echo is the test application of Canopy's local cluster and
// end-to-end tests: an HTTP and TCP echo server that also makes requests on
// a caller's behalf from inside its pod, and the matching client.
//
// Server endpoints:
//
//	GET  /                 JSON description of the server and the request
//	GET  /healthz          200 unless readiness was failed
//	POST /healthz/fail     make /healthz answer 503 (to test readiness)
//	POST /healthz/ok       make /healthz answer 200 again
//	GET  /fetch?url=U      GET U from inside this pod; relays status and body
//	GET  /dial?addr=A&msg=M  send M to TCP address A, return what echoes back
//	GET  /load/start?addr=A&duration=D[&interval=I&held=N&heldEvery=E]
//	                       start a load run against TCP echo server A: a new
//	                       connection every I (20ms) for D, and N long-lived
//	                       connections echoing every E (200ms)
//	GET  /load/stop        end the current run now (as if D were over)
//	GET  /load/result      the last run's LoadReport (409 while it runs)
//
// The gRPC mode (internal/echogrpc) adds GET /grpc and makes /healthz wait
// for its server.
//
// The TCP listener echoes every byte it receives.
package echo
