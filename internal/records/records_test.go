package records

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
)

// idTime is the creation time NewID encoded in id: its first ten digits.
func idTime(id string) (time.Time, error) {
	if err := CheckID(id); err != nil {
		return time.Time{}, err
	}
	s := id[strings.LastIndexByte(id, '_')+1:]
	var ms uint64
	for i := 0; i < 10; i++ {
		ms = ms<<5 | uint64(strings.IndexByte(crockford, s[i]))
	}
	return time.UnixMilli(int64(ms)).UTC(), nil
}

func TestIDsSortByTime(t *testing.T) {
	base := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	var ids []string
	for i := 0; i < 200; i++ {
		ids = append(ids, NewID("plan", base.Add(time.Duration(i)*time.Millisecond)))
	}
	if !sort.StringsAreSorted(ids) {
		t.Fatalf("IDs do not sort by creation time: %v", ids[:5])
	}
	for i, id := range ids {
		if err := CheckID(id); err != nil {
			t.Fatal(err)
		}
		got, err := idTime(id)
		if err != nil {
			t.Fatal(err)
		}
		if want := base.Add(time.Duration(i) * time.Millisecond); !got.Equal(want) {
			t.Fatalf("idTime(%s) = %v, want %v", id, got, want)
		}
		if KindOf(id) != "plan" {
			t.Fatalf("KindOf(%s) = %q", id, KindOf(id))
		}
	}
	if NewID("plan", base) == NewID("plan", base) {
		t.Fatal("two IDs in the same millisecond collide")
	}
}

func TestCheckIDRejectsPathsAndJunk(t *testing.T) {
	good := NewID("image_spec", time.Now())
	if err := CheckID(good); err != nil {
		t.Fatalf("%s: %v", good, err)
	}
	if KindOf(good) != "image_spec" {
		t.Fatalf("kind with underscore: %q", KindOf(good))
	}
	for _, bad := range []string{"", "plan", "plan_", "../plan_01JD0000000000000000000000", "plan_01JD00000000000000000000/0",
		"Plan_01JD0000000000000000000000", "plan_01JD000000000000000000000U", "plan_01JD00000000000000000000000"} {
		if CheckID(bad) == nil {
			t.Errorf("CheckID(%q) accepted", bad)
		}
	}
}

type widget struct {
	Meta
	Colour string `json:"colour"`
	Size   int    `json:"size,omitempty"`
}

func TestUnknownFieldsSurviveRoundTrip(t *testing.T) {
	in := `{"kind":"widget","id":"widget_01JD0000000000000000000000","v":3,"created_at":"2026-11-21T00:00:00Z","updated_at":"2026-11-21T00:00:00Z","colour":"red","future":{"a":[1,2]},"zeta":true}`
	var w widget
	if err := Unmarshal([]byte(in), &w); err != nil {
		t.Fatal(err)
	}
	if w.Colour != "red" || w.V != 3 {
		t.Fatalf("decoded %+v", w)
	}
	w.Size = 7
	out, err := Marshal(&w)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("output is not JSON: %s", out)
	}
	if string(m["future"]) != `{"a":[1,2]}` || string(m["zeta"]) != "true" || string(m["size"]) != "7" {
		t.Fatalf("unknown fields lost or changed: %s", out)
	}
	if !bytes.HasPrefix(out, []byte(`{"kind":"widget","id":`)) {
		t.Fatalf("common fields should lead: %s", out)
	}
}

func TestGenericKeepsEverything(t *testing.T) {
	in := `{"kind":"future_kind","id":"future_kind_01JD0000000000000000000000","v":1,"created_at":"2026-11-21T00:00:00Z","updated_at":"2026-11-21T00:00:00Z","vm_name":"tb-1","limits":{"vcpus":1}}`
	rec, err := Decode([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rec.(*Generic); !ok {
		t.Fatalf("an unknown kind decoded as %T", rec)
	}
	out, _ := Marshal(rec)
	var a, b any
	json.Unmarshal([]byte(in), &a)
	json.Unmarshal(out, &b)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Fatalf("round trip changed the record:\n in %s\nout %s", ja, jb)
	}
}

func TestDecodeErrorsAreShort(t *testing.T) {
	for in, want := range map[string]string{
		`{"kind":"plan"`: "invalid JSON",
		`[1,2]`:          "not a JSON object",
		`{"id":"plan_01JD0000000000000000000000"}`:                                `missing "kind"`,
		`{"kind":"plan"}`:                                                         `missing "id"`,
		`{"kind":"plan","id":"x"}`:                                                "malformed id",
		`{"kind":"sample","id":"plan_01JD0000000000000000000000"}`:                "does not belong",
		`{"kind":"sample","id":"sample_01JD0000000000000000000000","size":"big"}`: `field "size"`,
	} {
		_, err := Decode([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Decode(%s) = %v, want one line containing %q", in, err, want)
		}
	}
}

func TestReaderReportsLineNumbers(t *testing.T) {
	in := "\n" + `{"kind":"plan","id":"plan_01JD0000000000000000000000","v":1,"created_at":"2026-11-21T00:00:00Z","updated_at":"2026-11-21T00:00:00Z"}` + "\n\n{bad\n"
	r := NewReader(strings.NewReader(in), "stdin")
	if _, err := r.Record(); err != nil {
		t.Fatal(err)
	}
	_, err := r.Record()
	var le *LineError
	if !errors.As(err, &le) || le.Line != 4 || !strings.HasPrefix(err.Error(), "stdin:4: ") {
		t.Fatalf("got %v, want a stdin:4 error", err)
	}
	if _, err := r.Record(); err != io.EOF {
		t.Fatalf("after the last line: %v", err)
	}
}

func TestDurationText(t *testing.T) {
	var d struct{ D Duration }
	if err := json.Unmarshal([]byte(`{"D":"1h30m"}`), &d); err != nil || d.D.D() != 90*time.Minute {
		t.Fatalf("%v %v", d.D, err)
	}
	if err := json.Unmarshal([]byte(`{"D":45}`), &d); err != nil || d.D.D() != 45*time.Second {
		t.Fatalf("%v %v", d.D, err)
	}
	if err := json.Unmarshal([]byte(`{"D":"soon"}`), &d); err == nil {
		t.Fatal("accepted a bad duration")
	}
	b, _ := json.Marshal(Duration(2 * time.Minute))
	if string(b) != `"2m0s"` {
		t.Fatalf("marshal: %s", b)
	}
}

func TestUnmarshalResetsReusedStruct(t *testing.T) {
	var w widget
	a := `{"kind":"widget","id":"widget_01JD0000000000000000000000","v":1,"created_at":"2026-11-21T00:00:00Z","updated_at":"2026-11-21T00:00:00Z","colour":"red","size":3,"extra":1}`
	b := `{"kind":"widget","id":"widget_01JD0000000000000000000001","v":1,"created_at":"2026-11-21T00:00:00Z","updated_at":"2026-11-21T00:00:00Z","colour":"blue"}`
	if err := Unmarshal([]byte(a), &w); err != nil {
		t.Fatal(err)
	}
	if err := Unmarshal([]byte(b), &w); err != nil {
		t.Fatal(err)
	}
	if w.Size != 0 || w.Extra != nil || w.Colour != "blue" {
		t.Fatalf("stale fields survived a second Unmarshal: %+v", w)
	}
}

func TestIndentedUnknownFieldsStayOnOneLine(t *testing.T) {
	in := "{\"kind\":\"widget\",\"id\":\"widget_01JD0000000000000000000000\",\"v\":1,\"created_at\":\"2026-11-21T00:00:00Z\",\"updated_at\":\"2026-11-21T00:00:00Z\",\"later\":{\n  \"a\": 1\n}}"
	var w widget
	if err := Unmarshal([]byte(in), &w); err != nil {
		t.Fatal(err)
	}
	out, _ := Marshal(&w)
	if bytes.ContainsRune(out, '\n') || !bytes.Contains(out, []byte(`"later":{"a":1}`)) {
		t.Fatalf("not one compact line: %s", out)
	}
}

// FuzzUnknownFields: for any JSON object Unmarshal accepts, the unknown
// fields are those a decode into a map finds: escaped keys unescaped (as
// encoding/json does, invalid UTF-8 and lone surrogates included), a key
// given twice with its last value, nested values whole. The seeds run with
// every go test.
func FuzzUnknownFields(f *testing.F) {
	head := `"kind":"widget","id":"widget_01JD0000000000000000000000","v":1,"created_at":"2026-11-21T00:00:00Z","updated_at":"2026-11-21T00:00:00Z"`
	for _, tail := range []string{
		``,
		`,"\u0066uture":1`,
		`,"dup":1,"dup":{"b":[true,null]}`,
		`,"nested":{"colour":"not this one","x":"}{\""},"arr":[{"a":1},[2]]`,
		`,"ünïcode":"✓","":0`,
		`,"colour":"red","colour":"blue"`,
		"\n ,\t\"spaced\" :\n [ 1 , 2 ] ",
		`,"\ud800x":2`,
		"\n,\"a\xffb\":3",
	} {
		var w widget
		if err := Unmarshal([]byte("{"+head+tail+"}"), &w); err != nil {
			f.Fatalf("seed %q: %v", tail, err)
		}
		f.Add(tail)
	}
	f.Fuzz(func(t *testing.T, tail string) {
		in := []byte("{" + head + tail + "}")
		var w widget
		if Unmarshal(in, &w) != nil {
			return
		}
		var all map[string]json.RawMessage
		if err := json.Unmarshal(in, &all); err != nil {
			t.Fatalf("Unmarshal took %q, a map decode does not: %v", in, err)
		}
		known := knownFields(reflect.TypeOf(&w))
		want := map[string]string{}
		for k, v := range all {
			if !known[k] {
				var c bytes.Buffer
				if err := json.Compact(&c, v); err != nil {
					t.Fatal(err)
				}
				want[k] = c.String()
			}
		}
		got := map[string]string{}
		for k, v := range w.Extra {
			got[k] = string(v)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("%q: extra %q, want %q", in, got, want)
		}
	})
}

// TestIsCrockford: the characters of an ID's time and randomness are
// crockford's, and no other byte.
func TestIsCrockford(t *testing.T) {
	for c := 0; c < 256; c++ {
		if got, want := isCrockford(byte(c)), strings.IndexByte(crockford, byte(c)) >= 0; got != want {
			t.Errorf("isCrockford(%q) = %v", rune(c), got)
		}
	}
}
