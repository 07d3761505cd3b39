package sample

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadAllNoticesSizeChanges reads a file as Prepare does, told a size
// it had before: whole when the size holds, an error when the file has grown
// or shrunk since.
func TestReadAllNoticesSizeChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	content := bytes.Repeat([]byte("0123456789"), 10)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		size int64
		ok   bool
	}{{100, true}, {50, false}, {150, false}} {
		fd, err := unix.Open(path, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		got, err := readAll(fd, tc.size, make([]byte, 0, 8))
		unix.Close(fd)
		switch {
		case tc.ok && (err != nil || !bytes.Equal(got, content)):
			t.Errorf("size %d: %d bytes, %v", tc.size, len(got), err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "changed size")):
			t.Errorf("size %d: %d bytes, %v; want a size change", tc.size, len(got), err)
		}
	}
}
