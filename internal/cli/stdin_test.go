package cli

import (
	"io"
	"os"
	"strings"
	"testing"
)

func TestStdinPiped(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	f, err := os.CreateTemp(t.TempDir(), "in")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	closed, err := os.CreateTemp(t.TempDir(), "closed")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	for _, tc := range []struct {
		name  string
		stdin io.Reader
		want  bool
	}{
		{"pipe", r, true},
		{"file", f, true},
		{"reader", strings.NewReader("x"), true},
		{"/dev/null", null, false},
		{"closed", closed, false},
		{"none", nil, false},
	} {
		if got := (&Env{Stdin: tc.stdin}).StdinPiped(); got != tc.want {
			t.Errorf("%s: StdinPiped() = %v, want %v", tc.name, got, tc.want)
		}
	}
}
