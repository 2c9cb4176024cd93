// Package debugjson renders Canopy's workload and authorization protos as
// JSON for people, in the controller's debug views: protojson's form
// (lowerCamelCase names, enum names, oneofs, Any with @type) except that
// the bytes fields holding IP addresses are written as text ("10.244.1.5",
// "fd00::3") rather than base64. The output is valid JSON with sorted
// keys, so it is stable enough for golden files. It is not a wire format:
// nothing parses it back into protos. It holds no state; any goroutine may
// call it.
package debugjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// IsIPField reports whether a bytes field holds a raw IP address (4 bytes
// for IPv4, 16 for IPv6), as proto/workload.proto and
// proto/authorization.proto document them.
func IsIPField(fd protoreflect.FieldDescriptor) bool {
	switch fd.FullName() {
	case "istio.workload.Workload.addresses",
		"istio.workload.NetworkAddress.address",
		"istio.security.Address.address":
		return true
	}
	return false
}

// Marshal renders m as protojson does, with IP fields as text. An IP field
// whose length is neither 4 nor 16 stays base64, so that a malformed table
// entry still shows what it holds.
func Marshal(m proto.Message) (json.RawMessage, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // int64 fields are strings already; keep the rest exact
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("decode protojson: %w", err)
	}
	rewrite(m.ProtoReflect(), v)
	return json.Marshal(v)
}

// rewrite walks m and its JSON form v together, replacing IP fields.
func rewrite(m protoreflect.Message, v any) {
	obj, ok := v.(map[string]any)
	if !ok {
		return
	}
	if m.Descriptor().FullName() == "google.protobuf.Any" {
		// protojson writes an Any as {"@type": ..., <the message's fields>}.
		inner, err := anypb.UnmarshalNew(m.Interface().(*anypb.Any), proto.UnmarshalOptions{})
		if err == nil {
			rewrite(inner.ProtoReflect(), obj)
		}
		return
	}
	if isWellKnown(m.Descriptor()) {
		return // special JSON forms (wrappers, Empty, ...): no IP inside
	}
	m.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		name := fd.JSONName()
		field, ok := obj[name]
		if !ok {
			return true
		}
		switch {
		case fd.Kind() == protoreflect.BytesKind && IsIPField(fd):
			if fd.IsList() {
				items, ok := field.([]any)
				l := val.List()
				if !ok || len(items) != l.Len() {
					return true
				}
				for i := range items {
					if s, ok := ipText(l.Get(i).Bytes()); ok {
						items[i] = s
					}
				}
			} else if s, ok := ipText(val.Bytes()); ok {
				obj[name] = s
			}
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			items, ok := field.(map[string]any)
			if !ok {
				return true
			}
			val.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				rewrite(mv.Message(), items[k.String()])
				return true
			})
		case fd.Message() != nil:
			if fd.IsList() {
				items, ok := field.([]any)
				l := val.List()
				if !ok || len(items) != l.Len() {
					return true
				}
				for i := range items {
					rewrite(l.Get(i).Message(), items[i])
				}
			} else {
				rewrite(val.Message(), field)
			}
		}
		return true
	})
}

func ipText(b []byte) (string, bool) {
	a, ok := netip.AddrFromSlice(b)
	if !ok {
		return "", false
	}
	return a.String(), true
}

func isWellKnown(md protoreflect.MessageDescriptor) bool {
	return md.ParentFile().Package() == "google.protobuf"
}
