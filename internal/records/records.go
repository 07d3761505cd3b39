// Package records is the JSON-lines record contract shared by every tb-* tool:
// common fields, time-sortable kind-prefixed IDs, and encoding that keeps
// fields this version does not know about.
package records

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/tidwall/gjson"
)

// SchemaVersion is written as "v" on every record this build creates.
const SchemaVersion = 1

// Meta holds the fields every record carries. Embed it in each kind's struct.
type Meta struct {
	Kind      string    `json:"kind"`
	ID        string    `json:"id"`
	V         int       `json:"v"`
	Rev       int64     `json:"rev,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`

	// Extra keeps the fields a newer writer added, so that a read-modify-write
	// by this version never drops them.
	Extra map[string]json.RawMessage `json:"-"`
}

// Header gives access to the common fields; every record type implements it
// by embedding Meta.
func (m *Meta) Header() *Meta { return m }

// Record is any kind's struct that embeds Meta.
type Record interface{ Header() *Meta }

// Init stamps a fresh record of the given kind with a new ID and timestamps.
func Init(r Record, kind string, now time.Time) {
	h := r.Header()
	h.Kind = kind
	h.ID = NewID(kind, now)
	h.V = SchemaVersion
	h.CreatedAt = now.UTC().Truncate(time.Microsecond)
	h.UpdatedAt = h.CreatedAt
}

// Generic is a record of any kind, all of whose non-common fields live in Extra.
type Generic struct {
	Meta
}

// selfEncoder is a record that appends its own JSON encoding, the bytes
// json.Marshal would write for it, without reflection (an observable: a
// capture stores tens of thousands).
type selfEncoder interface {
	AppendJSON(b []byte) []byte
}

// Marshal encodes r as one JSON object, with Extra fields appended after the
// known ones in sorted key order.
func Marshal(r Record) ([]byte, error) {
	return AppendMarshal(nil, r)
}

// AppendMarshal appends Marshal's encoding of r to dst: a record that
// encodes itself does so in place, with no buffer of its own.
func AppendMarshal(dst []byte, r Record) ([]byte, error) {
	if e, ok := r.(selfEncoder); ok && len(r.Header().Extra) == 0 {
		return e.AppendJSON(dst), nil
	}
	body, err := marshalReflect(r)
	if err != nil {
		return dst, err
	}
	if dst == nil {
		return body, nil
	}
	return append(dst, body...), nil
}

func marshalReflect(r Record) ([]byte, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	extra := r.Header().Extra
	if len(extra) == 0 {
		return body, nil
	}
	known := knownFields(reflect.TypeOf(r))
	keys := make([]string, 0, len(extra))
	for k := range extra {
		if !known[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.Grow(len(body) + 64*len(keys))
	b.Write(body[:len(body)-1])
	empty := bytes.Equal(body, []byte("{}"))
	for _, k := range keys {
		if !empty {
			b.WriteByte(',')
		}
		empty = false
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		b.Write(extra[k])
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Unmarshal decodes one JSON object into r and keeps unknown fields in Extra.
// It checks that the common fields are present.
func Unmarshal(data []byte, r Record) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return errNotObject
	}
	// encoding/json merges into maps and keeps fields the input lacks: start
	// from zero so a reused struct cannot carry stale values into a write.
	if v := reflect.ValueOf(r); v.Kind() == reflect.Pointer && !v.IsNil() {
		v.Elem().SetZero()
	}
	if unmarshalStrict(data, r) == nil {
		r.Header().Extra = nil
		return Validate(r.Header())
	}
	if v := reflect.ValueOf(r); v.Kind() == reflect.Pointer && !v.IsNil() {
		v.Elem().SetZero()
	}
	if err := unmarshalGeneral(data, r); err != nil {
		return err
	}
	return Validate(r.Header())
}

// unmarshalGeneral decodes any JSON object into r, as encoding/json does,
// and keeps the members r does not know in Extra.
func unmarshalGeneral(data []byte, r Record) error {
	if err := json.Unmarshal(data, r); err != nil {
		return cleanJSONError(err)
	}
	// The fields r does not know, found by a walk of the object's keys
	// (json.Unmarshal has checked it is valid JSON) rather than a second
	// decode into a map, which cost as much as the first. A key given twice
	// keeps its last value, as the map did.
	known := knownFields(reflect.TypeOf(r))
	h := r.Header()
	h.Extra = nil
	var err error
	gjson.ParseBytes(data).ForEach(func(k, v gjson.Result) bool {
		name := k.Str
		if strings.ContainsFunc(k.Raw, func(c rune) bool { return c == '\\' || c >= utf8.RuneSelf }) {
			// Escapes and bytes beyond ASCII are unquoted as
			// encoding/json unquotes them (invalid UTF-8 and lone
			// surrogates become U+FFFD), not as gjson does.
			if err = json.Unmarshal([]byte(k.Raw), &name); err != nil {
				return false
			}
		}
		if known[name] {
			return true
		}
		if h.Extra == nil {
			h.Extra = make(map[string]json.RawMessage)
		}
		// Compact, so a record stays one line whatever its writer indented.
		var c bytes.Buffer
		if err = json.Compact(&c, []byte(v.Raw)); err != nil {
			return false
		}
		h.Extra[name] = c.Bytes()
		return true
	})
	if err != nil {
		return cleanJSONError(err)
	}
	return nil
}

var errNotObject = errors.New("not a JSON object")

// unmarshalStrict decodes a record as this package's encoders write it:
// every member known to r, named exactly, once, in valid UTF-8. A record
// read back from the state is that, and this decoder (encoding/json/v2's,
// from go-json-experiment until Go 1.27 has it without an experiment) takes
// it in about a third of encoding/json's time with no walk for unknown
// fields. Anything else fails here and is decoded again by Unmarshal's
// general path, which is the one that defines the result: for every input
// this one takes, the two give the same record (FuzzUnmarshalStrictAgrees).
// It takes only an object: v2 decodes a top-level null into a struct as a
// no-op, where the general path's walk would see members that are not there.
func unmarshalStrict(data []byte, r Record) error {
	if d := bytes.TrimLeft(data, " \t\r\n"); len(d) == 0 || d[0] != '{' {
		return errNotObject
	}
	return jsonv2.Unmarshal(data, r, jsonv2.RejectUnknownMembers(true))
}

// Validate checks the common fields of a decoded record.
func Validate(h *Meta) error {
	switch {
	case h.Kind == "":
		return fmt.Errorf(`missing "kind"`)
	case h.ID == "":
		return fmt.Errorf(`missing "id"`)
	case !ValidKind(h.Kind):
		return fmt.Errorf("invalid kind %q", h.Kind)
	}
	if err := CheckID(h.ID); err != nil {
		return err
	}
	if k := KindOf(h.ID); k != h.Kind {
		return fmt.Errorf("id %q does not belong to kind %q", h.ID, h.Kind)
	}
	return nil
}

// Decode reads the kind of a raw line and decodes it into the matching typed
// struct when one is registered, or into Generic otherwise.
func Decode(data []byte) (Record, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return nil, fmt.Errorf("not a JSON object")
	}
	var probe struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, cleanJSONError(err)
	}
	r := New(probe.Kind)
	if err := Unmarshal(data, r); err != nil {
		return nil, err
	}
	return r, nil
}

var fieldCache sync.Map // reflect.Type -> map[string]bool

// knownFields lists the JSON keys a struct type decodes, including those of
// embedded structs.
func knownFields(t reflect.Type) map[string]bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]bool)
	}
	m := make(map[string]bool)
	collectFields(t, m)
	fieldCache.Store(t, m)
	return m
}

func collectFields(t reflect.Type, m map[string]bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				collectFields(ft, m)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		m[cmp.Or(name, f.Name)] = true
	}
}

// cleanJSONError turns encoding/json's errors into short reasons.
func cleanJSONError(err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case asErr(err, &se):
		return fmt.Errorf("invalid JSON at byte %d: %s", se.Offset, se.Error())
	case asErr(err, &te):
		if te.Field != "" {
			return fmt.Errorf("field %q: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return fmt.Errorf("expected %s, got JSON %s", te.Type, te.Value)
	}
	return err
}
