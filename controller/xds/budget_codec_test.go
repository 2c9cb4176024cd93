package xds

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func response(resources, size int) *discoveryv3.DeltaDiscoveryResponse {
	r := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: "t", Nonce: "1"}
	for i := range resources {
		r.Resources = append(r.Resources, &discoveryv3.Resource{Name: fmt.Sprint(i), Version: "v",
			Resource: &anypb.Any{TypeUrl: "t", Value: bytes.Repeat([]byte{'x'}, size)}})
	}
	return r
}

// TestBudgetCodecBytes: the budget's codec encodes every message as
// gRPC's proto codec does, and a budgeted response's share returns when
// the transport frees its buffer, not before.
func TestBudgetCodecBytes(t *testing.T) {
	for _, tt := range []struct {
		name     string
		msg      *discoveryv3.DeltaDiscoveryResponse
		budgeted bool
		// held: the share is kept until the buffer is freed.
		held bool
	}{
		{"not budgeted", response(10, 10), false, false},
		{"budgeted, below gRPC's pooling threshold", response(1, 10), true, false},
		{"budgeted, small", response(10, 1000), true, false},
		{"budgeted, large", response(100, 1000), true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := NewSendBudget(1 << 20)
			c := b.Codec()
			var h *hold
			if tt.budgeted {
				var err error
				if h, err = b.reserve(context.Background(), "caller", 0); err != nil {
					t.Fatal(err)
				}
				if err := h.settle(context.Background(), tt.msg, time.Minute, func() { t.Error("deadline ran") }); err != nil {
					t.Fatal(err)
				}
			}
			got, err := c.Marshal(tt.msg)
			if err != nil {
				t.Fatal(err)
			}
			want, err := proto.Marshal(tt.msg)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Materialize(), want) {
				t.Error("encoded differently from proto.Marshal")
			}
			back := new(discoveryv3.DeltaDiscoveryResponse)
			if err := c.Unmarshal(got, back); err != nil || !proto.Equal(back, tt.msg) {
				t.Errorf("round trip: %v", err)
			}
			if tt.held && b.Used() != int64(len(want)) {
				t.Errorf("%d bytes used while in the transport, want %d", b.Used(), len(want))
			}
			got.Free()
			if b.Used() != 0 {
				t.Errorf("%d bytes used once the buffer is freed", b.Used())
			}
			if h != nil {
				h.release()
			}
		})
	}
}

// TestBudgetSettleGivesBackTheRest: a reservation larger than the built
// response keeps only what the response weighs.
func TestBudgetSettleGivesBackTheRest(t *testing.T) {
	b := NewSendBudget(4 << 20)
	h, err := b.reserve(context.Background(), "caller", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if b.Used() != 1<<20 {
		t.Fatalf("reserved %d, want %d", b.Used(), 1<<20)
	}
	msg := response(100, 1000)
	if err := h.settle(context.Background(), msg, time.Minute, func() {}); err != nil {
		t.Fatal(err)
	}
	if want := int64(proto.Size(msg)); b.Used() != want {
		t.Errorf("after settle %d used, want the response's %d", b.Used(), want)
	}
	b.sent(msg) // not encoded: the share returns
	if b.Used() != 0 {
		t.Errorf("%d used after an unencoded response was sent", b.Used())
	}
	if len(b.callers) != 0 {
		t.Errorf("%d callers' parts kept after their last response", len(b.callers))
	}
}

// TestBudgetCallerPart: a response larger than a caller's part takes all of
// the part and its whole size from the budget; the caller's next response
// waits, another caller's does not.
func TestBudgetCallerPart(t *testing.T) {
	b := NewSendBudget(4 << 20) // a caller's part: 1 MiB
	ctx := context.Background()
	big, err := b.reserve(ctx, "a", 3<<20)
	if err != nil {
		t.Fatal(err)
	}
	if b.Used() != 3<<20 {
		t.Errorf("a 3 MiB response took %d bytes, want all 3 MiB", b.Used())
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := b.reserve(short, "a", 64<<10); err == nil {
		t.Error("a second response of the same caller got budget past its part")
	}
	other, err := b.reserve(ctx, "b", 512<<10)
	if err != nil {
		t.Fatalf("another caller waited: %v", err)
	}
	other.release()
	big.release()
	if b.Used() != 0 || len(b.callers) != 0 {
		t.Errorf("after release: %d used, %d callers kept", b.Used(), len(b.callers))
	}
	again, err := b.reserve(ctx, "a", 1<<20)
	if err != nil {
		t.Fatalf("the caller's part did not come back: %v", err)
	}
	again.release()
}
