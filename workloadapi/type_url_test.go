package workloadapi_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// The type URL constants must be what anypb writes for each message, or a
// resource would be sent under one type and decoded as another.
func TestTypeURLsMatchMessages(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		url string
		msg proto.Message
	}{
		{workloadapi.AddressTypeURL, &workloadapi.Address{}},
		{workloadapi.WorkloadTypeURL, &workloadapi.Workload{}},
		{workloadapi.AuthorizationTypeURL, &security.Authorization{}},
	} {
		a, err := anypb.New(tt.msg)
		if err != nil {
			t.Fatal(err)
		}
		if a.GetTypeUrl() != tt.url {
			t.Errorf("Any of %T has type URL %q, constant says %q", tt.msg, a.GetTypeUrl(), tt.url)
		}
	}
}
