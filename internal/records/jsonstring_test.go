package records

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// appendJSONString escapes every byte value, at every position of strings
// of several lengths, as encoding/json does, and multi-byte runes (whole,
// cut short) after plain bytes.
func TestJSONStringEveryByteEveryPosition(t *testing.T) {
	for n := 1; n <= 17; n++ {
		for at := 0; at < n; at++ {
			for c := 0; c < 256; c++ {
				b := []byte(strings.Repeat("a", n))
				b[at] = byte(c)
				checkJSONString(t, string(b))
			}
			for _, r := range []string{"é", "\u2028", "😀", "\xe2\x82"} {
				checkJSONString(t, strings.Repeat("a", at)+r+strings.Repeat("b", n))
			}
		}
	}
}

func checkJSONString(t *testing.T, s string) {
	t.Helper()
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
		t.Fatalf("%q: got %s, want %s", s, got, want)
	}
}
