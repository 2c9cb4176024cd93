package index

import "github.com/canopy-mesh/canopy/controller/ambient"

// The tables read namespaces' and nodes' labels and annotations only
// through the views here (ambient.Labels), which record every key a build
// reads. An update of a namespace or node recomputes outputs only when a
// key some build has read changed: nobody lists what the builders read,
// and a builder that starts reading another key is tracked at once.
//
// A key once read stays recorded: at worst a change of it recomputes
// outputs that no longer read it. The record of a namespace or node goes
// with it.

// keysRead are the label and annotation keys read of one object.
type keysRead struct {
	labels, annotations map[string]bool
}

func (r *keysRead) label(k string)      { r.labels[k] = true }
func (r *keysRead) annotation(k string) { r.annotations[k] = true }

// changed reports whether a key read differs between two versions of the
// labels and annotations: its value, or whether it is set.
func (r *keysRead) changed(oldLabels, newLabels, oldAnnotations, newAnnotations map[string]string) bool {
	differ := func(keys map[string]bool, a, b map[string]string) bool {
		for k := range keys {
			av, aok := a[k]
			bv, bok := b[k]
			if av != bv || aok != bok {
				return true
			}
		}
		return false
	}
	return r != nil && (differ(r.labels, oldLabels, newLabels) || differ(r.annotations, oldAnnotations, newAnnotations))
}

func readsOf(m map[string]*keysRead, name string) *keysRead {
	r := m[name]
	if r == nil {
		r = &keysRead{labels: map[string]bool{}, annotations: map[string]bool{}}
		m[name] = r
	}
	return r
}

// namespaceView is namespace ns's labels and annotations as the builders
// read them (empty when the index holds no such namespace). The caller
// holds x.mu.
func (x *Index) namespaceView(ns string) (labels, annotations ambient.Labels) {
	r := readsOf(x.namespaceReads, ns)
	var l, a map[string]string
	if n := x.namespaces[ns]; n != nil {
		l, a = n.Labels, n.Annotations
	}
	return ambient.ReadLabels(l, r.label), ambient.ReadLabels(a, r.annotation)
}

// nodeView is a node's labels as the builders read them. The caller holds
// x.mu.
func (x *Index) nodeView(name string) ambient.Labels {
	r := readsOf(x.nodeReads, name)
	var l map[string]string
	if n := x.nodes[name]; n != nil {
		l = n.Labels
	}
	return ambient.ReadLabels(l, r.label)
}
