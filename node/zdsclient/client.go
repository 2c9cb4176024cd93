// Package zdsclient is the node proxy's side of ZDS
// (docs/wire-contract.md §3): it connects to the CNI agent's socket with
// backoff, says hello, and hands each pod (with its netns handle) to a
// Handler, acknowledging every message; a handler's error goes back in the
// Ack.
package zdsclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"time"

	"github.com/canopy-mesh/canopy/internal/zdsconn"
	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

// Handler receives the agent's messages in order.
type Handler interface {
	// Add starts serving a pod inside netns; the handler owns the file.
	Add(uid string, info *zdspb.WorkloadInfo, netns *os.File) error
	// Keep says a pod the handler may hold is still alive (snapshot only).
	Keep(uid string) error
	// Snapshot ends the snapshot: pods neither added nor kept in it are
	// gone.
	Snapshot() error
	// Del stops serving a pod.
	Del(uid string) error
}

// Client keeps a ZDS connection.
type Client struct {
	Path    string
	Handler Handler
	Log     *slog.Logger
	// Backoff bounds (default 10ms to 15s, as ztunnel).
	MinBackoff, MaxBackoff time.Duration
}

// Run connects and serves until ctx ends.
func (c Client) Run(ctx context.Context) error {
	minB, maxB := c.MinBackoff, c.MaxBackoff
	if minB <= 0 {
		minB = 10 * time.Millisecond
	}
	if maxB < minB {
		maxB = max(15*time.Second, minB)
	}
	backoff := minB
	for ctx.Err() == nil {
		served, err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if served {
			backoff = minB
		}
		c.Log.Warn("ZDS connection ended; reconnecting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(2*backoff, maxB)
	}
	return nil
}

// session runs one connection; served reports whether a snapshot came.
func (c Client) session(ctx context.Context) (served bool, err error) {
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: c.Path, Net: "unixpacket"})
	if err != nil {
		return false, err
	}
	conn := zdsconn.New(uc)
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := conn.Send(&zdspb.ZdsHello{Version: zdspb.Version_V1}, nil, time.Now().Add(5*time.Second)); err != nil {
		return false, err
	}
	if b, ok := c.Handler.(interface{ Begin() }); ok {
		b.Begin() // a new snapshot starts
	}
	snapshotDone := false
	for {
		var req zdspb.WorkloadRequest
		fds, err := conn.Recv(&req, time.Time{})
		if err != nil {
			return served, err
		}
		herr := c.dispatch(&req, fds, &snapshotDone)
		if errors.Is(herr, zdsconn.ErrProtocol) {
			return served, herr
		}
		served = served || snapshotDone
		ack := &zdspb.Ack{}
		if herr != nil {
			// Bounded so the Ack fits one datagram: a long error is a
			// refusal, never the end of the session.
			ack.Error = zdsconn.AckError(herr.Error())
		}
		if err := conn.Send(&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: ack}}, nil, time.Now().Add(5*time.Second)); err != nil {
			return served, err
		}
	}
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

func (c Client) dispatch(req *zdspb.WorkloadRequest, fds []*os.File, snapshotDone *bool) error {
	switch r := req.GetPayload().(type) {
	case *zdspb.WorkloadRequest_Add:
		if len(fds) != 1 {
			closeAll(fds)
			return fmt.Errorf("%w: AddWorkload with %d fds, want 1", zdsconn.ErrProtocol, len(fds))
		}
		if !zdsconn.IsNetns(fds[0]) {
			fds[0].Close()
			return fmt.Errorf("pod %s: the fd is not a network namespace", r.Add.GetUid())
		}
		return c.Handler.Add(r.Add.GetUid(), r.Add.GetWorkloadInfo(), fds[0])
	}
	if len(fds) > 0 {
		closeAll(fds)
		return fmt.Errorf("%w: fds on a message other than AddWorkload", zdsconn.ErrProtocol)
	}
	switch r := req.GetPayload().(type) {
	case *zdspb.WorkloadRequest_Keep:
		if *snapshotDone {
			return fmt.Errorf("%w: KeepWorkload after SnapshotSent", zdsconn.ErrProtocol)
		}
		return c.Handler.Keep(r.Keep.GetUid())
	case *zdspb.WorkloadRequest_SnapshotSent:
		if *snapshotDone {
			return fmt.Errorf("%w: a second SnapshotSent", zdsconn.ErrProtocol)
		}
		*snapshotDone = true
		return c.Handler.Snapshot()
	case *zdspb.WorkloadRequest_Del:
		return c.Handler.Del(r.Del.GetUid())
	}
	return fmt.Errorf("%w: unknown request", zdsconn.ErrProtocol)
}
