// Package pluginevent is the small protocol between the canopy-cni plugin
// and the node agent: JSON over HTTP on a unix socket, one request per
// CNI command. The plugin links it, so it stays free of client-go and
// gRPC.
package pluginevent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// DefaultSocket is where the agent listens.
const DefaultSocket = "/var/run/canopy/cni.sock"

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
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
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
	if resp.StatusCode != http.StatusOK {
		return Response{}, fmt.Errorf("node agent: %s", strings.TrimSpace(string(b)))
	}
	var out Response
	if err := json.Unmarshal(b, &out); err != nil {
		return Response{}, fmt.Errorf("node agent answered %q: %w", b, err)
	}
	return out, nil
}
