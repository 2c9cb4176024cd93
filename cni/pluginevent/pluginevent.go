// Package pluginevent is the small protocol between the canopy-cni plugin
// and the node agent: JSON over HTTP on a unix socket, one request per
// CNI command, and the namespace record the agent leaves on the node for
// the plugin to read when it cannot reach the agent. The plugin links it,
// so it stays free of client-go and gRPC.
package pluginevent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/canopy-mesh/canopy/internal/atomicfile"
)

// DefaultSocket is where the agent listens.
const DefaultSocket = "/var/run/canopy/cni.sock"

// ErrUnreachable: the agent could not be asked at all, because nothing
// listens on its socket or it says it is not ready to answer yet. An
// agent that answered, however late or badly, was reached.
var ErrUnreachable = errors.New("node agent unreachable")

// Paths of the three commands.
const (
	PathAdd   = "/cmdadd"
	PathDel   = "/cmddel"
	PathCheck = "/cmdcheck"
)

// Request is one CNI invocation for a pod.
type Request struct {
	ContainerID  string   `json:"containerID"`
	Netns        string   `json:"netns"`
	PodName      string   `json:"podName"`
	PodNamespace string   `json:"podNamespace"`
	PodUID       string   `json:"podUID,omitempty"`
	IPs          []string `json:"ips,omitempty"`
}

// Response is the agent's answer; Enrolled is false for pods outside the
// mesh, with Reason saying why.
type Response struct {
	Enrolled bool   `json:"enrolled"`
	Reason   string `json:"reason,omitempty"`
}

// Client calls the agent.
type Client struct {
	Socket  string
	Timeout time.Duration
}

// Do sends req to path and decodes the answer. A non-200 answer is an
// error carrying the agent's message.
func (c Client) Do(ctx context.Context, path string, req Request) (Response, error) {
	socket := c.Socket
	if socket == "" {
		socket = DefaultSocket
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	hc := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
			if err != nil && ctx.Err() == nil {
				return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
			}
			return c, err
		},
	}}
	body, err := json.Marshal(req)
	if err != nil {
		return Response{}, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://canopy-cni-agent"+path, bytes.NewReader(body))
	if err != nil {
		return Response{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(hreq)
	if err != nil {
		return Response{}, fmt.Errorf("node agent at %s: %w", socket, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Response{}, fmt.Errorf("node agent: %w", err)
	}
	if resp.StatusCode == http.StatusServiceUnavailable {
		return Response{}, fmt.Errorf("node agent: %w: %s", ErrUnreachable, strings.TrimSpace(string(b)))
	}
	if resp.StatusCode != http.StatusOK {
		return Response{}, fmt.Errorf("node agent: %s", strings.TrimSpace(string(b)))
	}
	var out Response
	if err := json.Unmarshal(b, &out); err != nil {
		return Response{}, fmt.Errorf("node agent answered %q: %w", b, err)
	}
	return out, nil
}

// DefaultNamespaceRecord is where the agent keeps its namespace record.
const DefaultNamespaceRecord = "/var/run/canopy/namespaces.json"

// NamespaceRecordVersion is the record format this package reads and
// writes; a record of another version is no record.
const NamespaceRecordVersion = 1

// maxRecord bounds what the plugin reads of a record.
const maxRecord = 4 << 20

// NamespaceRecord is what the agent knows, as of when it wrote it, of the
// namespaces whose pods may start while it cannot be reached. The list is
// positive: a namespace it does not name (one created since, or one whose
// pods may be in the mesh) keeps failing closed.
type NamespaceRecord struct {
	Version int `json:"version"`
	// OutsideMesh are namespaces none of whose new pods would be enrolled:
	// not labelled for the mesh, and no pod of the node in them enrolled
	// by its own label.
	OutsideMesh []string `json:"outsideMesh"`
}

// Outside reports whether the record says ns is outside the mesh.
func (r NamespaceRecord) Outside(ns string) bool { return slices.Contains(r.OutsideMesh, ns) }

// ReadNamespaceRecord reads the record at path. A missing, damaged or
// unknown-version record is an error: the caller fails closed.
func ReadNamespaceRecord(path string) (NamespaceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return NamespaceRecord{}, fmt.Errorf("namespace record: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxRecord+1))
	if err != nil {
		return NamespaceRecord{}, fmt.Errorf("namespace record: %w", err)
	}
	if len(b) > maxRecord {
		return NamespaceRecord{}, fmt.Errorf("namespace record %s is larger than %d bytes", path, maxRecord)
	}
	var r NamespaceRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return NamespaceRecord{}, fmt.Errorf("namespace record %s: %w", path, err)
	}
	if r.Version != NamespaceRecordVersion {
		return NamespaceRecord{}, fmt.Errorf("namespace record %s has version %d, want %d", path, r.Version, NamespaceRecordVersion)
	}
	return r, nil
}

// WriteNamespaceRecord replaces the record at path in one rename, so the
// plugin reads either the old record or the new one, never half of one.
func WriteNamespaceRecord(path string, r NamespaceRecord) error {
	r.Version = NamespaceRecordVersion
	if r.OutsideMesh == nil {
		r.OutsideMesh = []string{}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	// The plugin runs as root on the host; others have no business here.
	if err := atomicfile.Write(path, b, 0o644); err != nil {
		return fmt.Errorf("namespace record: %w", err)
	}
	return nil
}
