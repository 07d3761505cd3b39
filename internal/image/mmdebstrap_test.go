package image

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogTailReason: a failed mmdebstrap's one-line reason is its last
// error line, or its last line, however much it printed before.
func TestLogTailReason(t *testing.T) {
	tail := &logTail{}
	for i := range 5000 {
		fmt.Fprintf(tail, "I: line %d of a long build\n", i)
	}
	if got := tail.reason(); got != "I: line 4999 of a long build" || len(tail.b) > logTailMax {
		t.Errorf("no error line: %q (%d bytes kept)", got, len(tail.b))
	}
	fmt.Fprint(tail, "E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease\nW: cleaning up\n")
	if got := tail.reason(); !strings.HasPrefix(got, "E: Failed to fetch") {
		t.Errorf("with an error line: %q", got)
	}
}

// TestRemoveExcluded: what mmdebstrap's unfiltered extraction leaves at a
// spec's excluded paths is deleted as dpkg would have skipped it ('*'
// crossing '/', a merged-/usr path matched by its package's name), and
// nothing else is.
func TestRemoveExcluded(t *testing.T) {
	root := t.TempDir()
	for _, p := range []string{
		"usr/share/doc/bash/copyright", "usr/share/man/man1/ls.1.gz", "usr/share/locale/de/LC_MESSAGES/x.mo",
		"usr/lib/modules/6.1/kernel/drivers/usb/u.ko", "usr/lib/modules/6.1/kernel/drivers/net/virtio_net.ko",
		"usr/bin/ls", "usr/share/docs-kept/a", "etc/a[b]c", "etc/abc",
	} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	globs := []string{"/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/lib/modules/*/kernel/drivers/usb/*", "/etc/a[!x]c"}
	if err := removeExcluded(root, globs); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{
		"usr/share/doc/bash": false, "usr/share/doc": true, "usr/share/man/man1": false, "usr/share/locale/de": false,
		"usr/lib/modules/6.1/kernel/drivers/usb/u.ko": false, "usr/lib/modules/6.1/kernel/drivers/usb": true,
		"usr/lib/modules/6.1/kernel/drivers/net/virtio_net.ko": true, "usr/bin/ls": true, "usr/share/docs-kept/a": true,
		"etc/abc": false, "etc/a[b]c": true, "lib": true,
	} {
		_, err := os.Lstat(filepath.Join(root, p))
		if (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", p, err == nil, want)
		}
	}
}

func TestFnmatchRegexp(t *testing.T) {
	for _, c := range []struct {
		glob, path string
		match      bool
	}{
		{"/usr/share/doc/*", "/usr/share/doc/bash/copyright", true},
		{"/usr/share/doc/*", "/usr/share/doc", false},
		{"/lib/modules/*/kernel/sound/*", "/lib/modules/6.1.0-50-armmp/kernel/sound/core/snd.ko", true},
		{"/usr/bin/qemu-?-static", "/usr/bin/qemu-x-static", true},
		{"/a.b", "/aXb", false},
		{"/x[]y]z", "/x]z", true},
		{"/x[!]y]z", "/xaz", true},
		{"/x[!]y]z", "/xyz", false},
		{`/x\*`, "/x*", true},
		{`/x\*`, "/xa", false},
		{"/x[", "/x[", true},
	} {
		re, err := fnmatchRegexp(c.glob)
		if err != nil {
			t.Fatalf("%s: %v", c.glob, err)
		}
		if re.MatchString(c.path) != c.match {
			t.Errorf("%s against %s: %v, want %v", c.glob, c.path, !c.match, c.match)
		}
	}
}
