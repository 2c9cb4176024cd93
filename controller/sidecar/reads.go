package sidecar

import (
	"net/netip"
	"slices"
	"strings"
)

// Reads records what of a Mesh a share's generator read: the kinds of
// Istio configuration, the services, the endpoints of which hostnames,
// and a proxy's own endpoints. A share's dependencies are derived from
// it rather than declared: a control plane that generated a share with
// one Mesh may serve it for the next when the next Mesh's parts that the
// record names are the same (DepsOf), and a generator that starts reading
// something else is tracked without anyone editing a list, because every
// read of a Mesh's inputs goes through the methods that record it (a
// test holds the package to that).
//
// A Reads is filled by one generation at a time; the zero value is empty.
type Reads struct {
	kinds    [numConfigKinds]bool
	services bool
	// hosts are the hostnames whose services' endpoints were read,
	// sorted.
	hosts []string
	// own are the addresses whose endpoints were read as a proxy's own.
	own []netip.Addr
}

// reading returns a view of m that records what generators read into r
// (nil: records nothing). Views share m's indexes; only the recorder is
// their own, so a view per generation costs a copy of the struct.
func (m *Mesh) reading(r *Reads) *Mesh {
	v := *m
	v.reads = r
	return &v
}

func (m *Mesh) readKind(k configKind) {
	if m.reads != nil {
		m.reads.kinds[k] = true
	}
}

func (m *Mesh) readServices() {
	if m.reads != nil {
		m.reads.services = true
	}
}

func (m *Mesh) readEndpoints(hostname string) {
	if m.reads == nil {
		return
	}
	m.readServices()
	if i, found := slices.BinarySearch(m.reads.hosts, hostname); !found {
		m.reads.hosts = slices.Insert(m.reads.hosts, i, hostname)
	}
}

func (m *Mesh) readOwn(ips []netip.Addr) {
	if m.reads == nil {
		return
	}
	m.readServices()
	for _, ip := range ips {
		if !slices.Contains(m.reads.own, ip.Unmap()) {
			m.reads.own = append(m.reads.own, ip.Unmap())
		}
	}
}

// DepsOf summarises the parts of m that r names: the settings, each kind
// of configuration read, the services, the endpoints of each hostname
// read and the endpoints at each own address read. A share generated from
// one Mesh, recording r, generates the same from another Mesh whose
// DepsOf(r) is the same.
func (m *Mesh) DepsOf(r *Reads) string {
	// Every fingerprint is 8 bytes; each part has a tag byte.
	n := 8 + 9*(int(numConfigKinds)+2)
	for _, h := range r.hosts {
		n += len(h) + 9
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(m.fp.settings)
	for k, read := range r.kinds {
		if read {
			b.WriteByte(byte(k))
			b.WriteString(m.fp.configs[k])
		}
	}
	if r.services {
		b.WriteString("s")
		b.WriteString(m.fp.services)
	}
	for _, h := range r.hosts {
		b.WriteString("e")
		b.WriteString(h)
		b.WriteString(m.fp.endpoints[h])
	}
	if len(r.own) > 0 {
		b.WriteString("o")
		b.WriteString(m.ownSum(r.own))
	}
	return b.String()
}
