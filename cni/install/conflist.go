package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// The primary CNI's configuration is another vendor's file, which its own
// daemon may read back and compare with what it wrote. Chaining in edits it
// as bytes: the plugin list gains or loses the entry and nothing else
// changes, neither the primary plugins' objects (decoding and encoding them
// again would round integers above 2^53, escape <, > and &, reorder keys
// and re-indent) nor anything outside the list. Keys are looked up as
// libcni does: exact, and the last of duplicates wins.

// span is the bytes raw[start:end] of one JSON value in a file.
type span struct{ start, end int }

// member is one key of a JSON object and its value.
type member struct {
	key   string
	value span
}

// document is a CNI configuration file: one JSON object.
type document struct {
	raw     []byte
	object  span
	members []member
}

func parseDocument(raw []byte) (document, error) {
	if !json.Valid(raw) {
		return document{}, notJSON(raw)
	}
	d := document{raw: raw, object: span{0, len(raw)}}
	for isSpace(raw[d.object.start]) {
		d.object.start++
	}
	for isSpace(raw[d.object.end-1]) {
		d.object.end--
	}
	if raw[d.object.start] != '{' {
		return document{}, errors.New("not a JSON object")
	}
	var err error
	d.members, err = d.children(d.object, '{')
	return d, err
}

// notJSON says why raw is not JSON, naming a comment, which CNI
// configuration cannot hold but a hand-edited file sometimes does.
func notJSON(raw []byte) error {
	var v any
	err := json.Unmarshal(raw, &v)
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) && syntax.Offset > 0 && syntax.Offset <= int64(len(raw)) && raw[syntax.Offset-1] == '/' {
		return fmt.Errorf("not JSON: a comment at byte %d (CNI configuration is JSON, which has none)", syntax.Offset-1)
	}
	if err == nil {
		err = errors.New("invalid")
	}
	return fmt.Errorf("not JSON: %w", err)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// children returns the members of the object, or the elements of the
// array (with no keys), that raw[s.start:s.end] holds, where open is '{'
// or '['.
func (d document) children(s span, open json.Delim) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(d.raw[s.start:s.end]))
	if t, err := dec.Token(); err != nil || t != open {
		return nil, fmt.Errorf("at byte %d: want %v, got %v (%w)", s.start, open, t, err)
	}
	var out []member
	for dec.More() {
		var key string
		if open == '{' {
			t, err := dec.Token()
			if err != nil {
				return nil, err
			}
			key, _ = t.(string)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		// The decoder stops at the value's last byte, and the value it
		// returns starts after the whitespace before it.
		end := s.start + int(dec.InputOffset())
		m := member{key: key, value: span{end - len(v), end}}
		if m.value.start < s.start || !bytes.Equal(d.raw[m.value.start:end], v) {
			return nil, fmt.Errorf("at byte %d: value not where the decoder says", m.value.start)
		}
		out = append(out, m)
	}
	return out, nil
}

// last returns the value of key, the last if the object has it twice.
func (d document) last(key string) (span, bool) {
	for k := len(d.members) - 1; k >= 0; k-- {
		if d.members[k].key == key {
			return d.members[k].value, true
		}
	}
	return span{}, false
}

func (d document) bytes(s span) []byte { return d.raw[s.start:s.end] }

// plugins returns the plugin list and its elements; ok is false when the
// file has no "plugins" (a single-plugin configuration).
func (d document) plugins() (list span, elems []span, ok bool, err error) {
	list, ok = d.last("plugins")
	if !ok {
		return span{}, nil, false, nil
	}
	if d.raw[list.start] != '[' {
		return span{}, nil, false, errors.New(`"plugins" is not a list`)
	}
	ms, err := d.children(list, '[')
	if err != nil {
		return span{}, nil, false, err
	}
	for _, m := range ms {
		elems = append(elems, m.value)
	}
	return list, elems, true, nil
}

// isOurs reports whether a plugin is canopy-cni's, its "type" read as
// libcni reads it.
func isOurs(plugin []byte) bool {
	var p struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(plugin, &p) == nil && p.Type == PluginType
}

// sameJSON reports whether two of our entries say the same: the key order,
// spacing and escapes of our own entry do not matter.
func sameJSON(a, b []byte) bool {
	x, err1 := canonical(a)
	y, err2 := canonical(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

func canonical(b []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return marshal(v)
}

// marshal encodes v without escaping <, > and & (the file is no HTML).
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// chain returns raw with entry as the last plugin and no other plugin of
// ours, or nil if raw is so already. A single-plugin configuration becomes
// a plugin list (converted is then true): that plugin's object, verbatim,
// then the entry (libcni gives each plugin of a list the list's name and
// cniVersion, which are the object's own).
func chain(raw, entry []byte) (out []byte, converted bool, err error) {
	d, err := parseDocument(raw)
	if err != nil {
		return nil, false, err
	}
	_, elems, isList, err := d.plugins()
	if err != nil {
		return nil, false, err
	}
	if !isList {
		if _, ok := d.last("type"); !ok {
			return nil, false, errors.New(`neither "plugins" nor "type"`)
		}
		if isOurs(d.bytes(d.object)) {
			return nil, false, fmt.Errorf("its only plugin is %s: no primary plugin to chain after", PluginType)
		}
		if raw, err = listOf(d); err != nil {
			return nil, false, err
		}
		out, err := appendEntry(raw, entry)
		return out, true, err
	}
	if n := len(elems); n > 0 && sameJSON(d.bytes(elems[n-1]), entry) && ours(d, elems[:n-1]) == -1 {
		return nil, false, nil
	}
	if raw, _, err = unchainList(raw); err != nil {
		return nil, false, err
	}
	out, err = appendEntry(raw, entry)
	return out, false, err
}

// ours returns the index of the first of elems that is ours, or -1.
func ours(d document, elems []span) int {
	for k, e := range elems {
		if isOurs(d.bytes(e)) {
			return k
		}
	}
	return -1
}

// listOf makes a single-plugin configuration a plugin list of it, in a
// form unchain recognises: nothing of the file is lost, and the whitespace
// around the object goes around it in the list.
func listOf(d document) ([]byte, error) {
	name, ok := d.last("name")
	if !ok || d.raw[name.start] != '"' {
		return nil, errors.New(`no "name" string, which a plugin list needs`)
	}
	var b bytes.Buffer
	b.WriteString("{")
	if v, ok := d.last("cniVersion"); ok {
		b.WriteString(`"cniVersion":`)
		b.Write(d.bytes(v))
		b.WriteString(",")
	}
	b.WriteString(`"name":`)
	b.Write(d.bytes(name))
	b.WriteString(`,"plugins":[`)
	b.Write(d.raw[:d.object.end])
	b.WriteString("]}")
	b.Write(d.raw[d.object.end:])
	return b.Bytes(), nil
}

// appendEntry puts entry after the last plugin of raw's list, separated as
// the last two plugins are (or as the first is from "["), and indented as
// the plugins are when they start lines, with the file's line ends.
func appendEntry(raw, entry []byte) ([]byte, error) {
	d, err := parseDocument(raw)
	if err != nil {
		return nil, err
	}
	list, elems, _, err := d.plugins()
	if err != nil {
		return nil, err
	}
	if len(elems) == 0 {
		return nil, errors.New("an empty plugin list: no primary plugin to chain after")
	}
	last := elems[len(elems)-1]
	sep := append([]byte(","), raw[list.start+1:elems[0].start]...)
	if len(elems) > 1 {
		sep = raw[elems[len(elems)-2].end:last.start]
	}
	if nl := bytes.LastIndexByte(sep, '\n'); nl >= 0 && len(bytes.Trim(sep[nl+1:], " \t")) == 0 {
		indent := "  "
		if bytes.HasPrefix(sep[nl+1:], []byte("\t")) {
			indent = "\t"
		}
		var b bytes.Buffer
		if err := json.Indent(&b, entry, string(sep[nl+1:]), indent); err != nil {
			return nil, err
		}
		entry = b.Bytes()
		if nl > 0 && sep[nl-1] == '\r' {
			entry = bytes.ReplaceAll(entry, []byte("\n"), []byte("\r\n"))
		}
	}
	out := make([]byte, 0, len(raw)+len(sep)+len(entry))
	out = append(out, raw[:last.end]...)
	out = append(out, sep...)
	out = append(out, entry...)
	return append(out, raw[last.end:]...), nil
}

// unchain returns raw without our plugins, or nil if it has none. When
// that is exactly what chain made of a single-plugin configuration, single
// is that configuration.
func unchain(raw []byte) (out, single []byte, err error) {
	out, removed, err := unchainList(raw)
	if err != nil || removed == 0 {
		return nil, nil, err
	}
	single, _ = singleOf(out)
	return out, single, nil
}

// unchainList removes our plugins from raw's list, each with the separator
// before it, which is what appendEntry added (a run of ours that starts
// the list goes with the separator after it).
func unchainList(raw []byte) ([]byte, int, error) {
	d, err := parseDocument(raw)
	if err != nil {
		return nil, 0, err
	}
	_, elems, isList, err := d.plugins()
	if err != nil || !isList {
		return raw, 0, err
	}
	var cuts []span
	first := 0
	for first < len(elems) && isOurs(d.bytes(elems[first])) {
		first++
	}
	removed := first
	switch {
	case first == 0:
	case first == len(elems):
		cuts = append(cuts, span{elems[0].start, elems[first-1].end})
	default:
		cuts = append(cuts, span{elems[0].start, elems[first].start})
	}
	for k := first + 1; k < len(elems); k++ {
		if isOurs(d.bytes(elems[k])) {
			cuts = append(cuts, span{elems[k-1].end, elems[k].end})
			removed++
		}
	}
	if removed == 0 {
		return raw, 0, nil
	}
	out := make([]byte, 0, len(raw))
	at := 0
	for _, c := range cuts {
		out = append(out, raw[at:c.start]...)
		at = c.end
	}
	return append(out, raw[at:]...), removed, nil
}

// singleOf returns the single-plugin configuration that listOf made raw
// of, if it did.
func singleOf(raw []byte) ([]byte, bool) {
	d, err := parseDocument(raw)
	if err != nil {
		return nil, false
	}
	list, elems, isList, err := d.plugins()
	if err != nil || !isList || len(elems) != 1 {
		return nil, false
	}
	// The object with the whitespace that was around it.
	single := append(bytes.Clone(raw[list.start+1:elems[0].end]), raw[d.object.end:]...)
	s, err := parseDocument(single)
	if err != nil {
		return nil, false
	}
	if _, ok := s.last("type"); !ok {
		return nil, false
	}
	again, err := listOf(s)
	if err != nil || !bytes.Equal(again, raw) {
		return nil, false
	}
	return single, true
}
