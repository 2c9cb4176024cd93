package proxyless

import (
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

// callCredsEnv turns on grpc-go's support for call credentials in the xDS
// bootstrap (the token a proxyless client authenticates with). grpc-go
// reads it once, when its packages initialise, so the test binary starts
// itself again with it set.
const callCredsEnv = "GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS"

func TestMain(m *testing.M) {
	if os.Getenv(callCredsEnv) != "true" {
		if err := os.Setenv(callCredsEnv, "true"); err == nil {
			exe, err := os.Executable()
			if err == nil {
				err = syscall.Exec(exe, os.Args, os.Environ())
			}
			fmt.Fprintf(os.Stderr, "proxyless: restart with %s=true: %v\n", callCredsEnv, err)
			os.Exit(1)
		}
	}
	os.Exit(testenv.Main(m, &env))
}
