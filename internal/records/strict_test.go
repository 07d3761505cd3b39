package records

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// strictKinds are the kinds FuzzUnmarshalStrictAgrees decodes: every typed
// one, and one this build does not model.
var strictKinds = []string{
	KindSample, KindPlan, KindImage, KindBuild, KindCapture, KindArtifact,
	KindObservable, KindLease, KindSnapshot, KindAllow, KindRevision,
	KindCycle, KindExecution, KindAnalysis, KindEvent, KindWorker, "widget",
}

// filled returns a record of kind with every field it has set, nested
// structs, slices and maps included, as Marshal writes it.
func filled(t testing.TB, kind string) []byte {
	r := New(kind)
	fillValue(reflect.ValueOf(r).Elem(), 0)
	h := r.Header()
	h.Kind, h.ID, h.Extra = kind, kind+"_01JD0000000000000000000000", nil
	b, err := Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fillValue(v reflect.Value, depth int) {
	if depth > 6 {
		return
	}
	if v.Type() == reflect.TypeOf(time.Time{}) {
		v.Set(reflect.ValueOf(time.Date(2026, 11, 21, 1, 2, 3, 456789000, time.UTC)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("v<&>é\u2028" + v.Type().Name())
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(7 + depth))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(9 + depth))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fillValue(p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fillValue(s.Index(i), depth+1)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillValue(k, depth+1)
		if v.Type().Elem().Kind() == reflect.Interface {
			e.Set(reflect.ValueOf("x"))
		} else {
			fillValue(e, depth+1)
		}
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() && f.Tag.Get("json") != "-" {
				fillValue(v.Field(i), depth+1)
			}
		}
	}
}

// TestStoredRecordsTakeTheStrictPath: what Marshal writes of every kind
// decodes on the fast path, so that reading the state pays for it alone.
func TestStoredRecordsTakeTheStrictPath(t *testing.T) {
	for _, kind := range strictKinds[:len(strictKinds)-1] {
		b := filled(t, kind)
		if err := unmarshalStrict(b, New(kind)); err != nil {
			t.Errorf("%s: %v\n%s", kind, err, b)
		}
	}
}

// FuzzUnmarshalStrictAgrees: for every input the strict decoder takes, the
// general one (encoding/json and the walk for unknown members) gives the
// same record and no unknown member; the strict decoder only saves time.
func FuzzUnmarshalStrictAgrees(f *testing.F) {
	for i, kind := range strictKinds {
		b := filled(f, kind)
		f.Add(uint8(i), b)
		s := string(b)
		for _, edit := range [][2]string{
			{`"id":`, `"ID":`},           // another case
			{`"kind":`, `"\u006bind":`},  // an escaped name
			{`{"kind"`, `{"v":2,"kind"`}, // a name twice
			{`"v":1`, `"v":1.0`},         // a float for an int
			{`"v":1`, `"v":1e0`},         // an exponent
			{`"v":1`, `"v":null`},        // null for a number
			{`:"2026-11-21T01:02:03.456789Z"`, `:"2026-11-21T01:02:03.456789+01:00"`},
			{`:"2026-11-21T01:02:03.456789Z"`, `:"2026-11-21t01:02:03Z"`},
			{`:"2026-11-21T01:02:03.456789Z"`, `:"2026-11-21T24:00:00Z"`},
			{`:"2026-11-21T01:02:03.456789Z"`, `:null`},
			{`"v<&>é`, "\"v\xff"},  // invalid UTF-8
			{`"v<&>é`, `"v\ud800`}, // a lone surrogate
			{`[`, `null,"x":[`},    // an unknown member
			{`]`, `,null]`},        // null in a list
			{`"90s"`, `90`},        // a Duration in seconds
		} {
			if strings.Contains(s, edit[0]) {
				f.Add(uint8(i), []byte(strings.Replace(s, edit[0], edit[1], 1)))
			}
		}
	}
	f.Fuzz(func(t *testing.T, k uint8, in []byte) {
		kind := strictKinds[int(k)%len(strictKinds)]
		strict := New(kind)
		if unmarshalStrict(in, strict) != nil {
			return
		}
		general := New(kind)
		if err := unmarshalGeneral(in, general); err != nil {
			t.Fatalf("%s: the strict decoder took %q, the general one did not: %v", kind, in, err)
		}
		if len(general.Header().Extra) > 0 {
			t.Fatalf("%s: the strict decoder took %q, which has unknown members %v", kind, in, general.Header().Extra)
		}
		a, errA := json.Marshal(strict)
		b, errB := json.Marshal(general)
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Fatalf("%s: %q decodes differently:\nstrict  %s\ngeneral %s", kind, in, a, b)
		}
	})
}

// BenchmarkUnmarshalStored decodes an observable as the state stores it
// (a domain of the bulk capture of bench/tb-parse) with Unmarshal, which
// takes the strict path, beside the general path alone (encoding/json and
// the walk for unknown members, which Unmarshal was until the strict path).
func BenchmarkUnmarshalStored(b *testing.B) {
	line := []byte(`{"kind":"observable","id":"observable_01M8QGF921AD724T1K1MYG95R6","v":1,"rev":1,"created_at":"2026-12-01T00:35:59.681328Z","updated_at":"2026-12-01T00:35:59.681614Z","type":"domain","value":"host4550.domain88.example","lease":"lease_01JD0000000000000000000SHP","first_seen":"2026-11-21T00:00:00.00002Z","last_seen":"2026-11-21T00:00:00.07806Z","count":1,"sources":["pcap"],"provenance":[{"input":"bench/out/tb-parse-mixed-50000000.pcap","packet":2,"uid":"C2523vng32"},{"input":"bench/out/tb-parse-mixed-50000000.pcap","packet":3904,"uid":"C2523vng32"}],"domain":{"queries":1,"responses":1,"qtypes":["A"],"rcodes":["NOERROR"],"answers":[{"name":"host4550.domain88.example","type":"CNAME","data":"edge.host4550.domain88.example","ttl":300},{"name":"edge.host4550.domain88.example","type":"A","data":"192.0.2.25","ttl":60}],"addrs":["192.0.2.25"],"cnames":["edge.host4550.domain88.example"],"resolvers":["10.13.37.1"],"clients":["10.13.3.1"],"transports":["udp"]}}`)
	b.Run("Unmarshal", func(b *testing.B) {
		b.SetBytes(int64(len(line)))
		for b.Loop() {
			var o Observable
			if err := Unmarshal(line, &o); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("general", func(b *testing.B) {
		b.SetBytes(int64(len(line)))
		for b.Loop() {
			var o Observable
			if err := unmarshalGeneral(line, &o); err != nil {
				b.Fatal(err)
			}
		}
	})
}
