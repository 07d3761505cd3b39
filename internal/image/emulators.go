package image

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// binfmtConfDir holds the systemd-binfmt entries qemu-user-static installs;
// talkbox-binfmt registers them at boot.
const binfmtConfDir = "usr/lib/binfmt.d"

// userEmulators lists the qemu-user targets (the <name> of
// qemu-<name>-static) that the guest built from root registers with
// binfmt_misc. It reads the same entries as talkbox-binfmt and keeps those
// whose interpreter exists in root: the F flag makes the kernel open the
// interpreter when the entry is registered, so an entry whose emulator the
// spec's hardening excluded never registers, and the image record must not
// promise it.
func userEmulators(root string) ([]string, error) {
	confs, err := filepath.Glob(filepath.Join(root, binfmtConfDir, "qemu-*.conf"))
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, c := range confs {
		interps, err := binfmtInterpreters(c)
		if err != nil {
			return nil, err
		}
		for _, in := range interps {
			p, err := resolveIn(root, in)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c, err)
			}
			base := filepath.Base(p)
			name, ok := strings.CutPrefix(base, "qemu-")
			if !ok {
				return nil, fmt.Errorf("%s: interpreter %s is %s, not a qemu-<name>-static", c, in, p)
			}
			seen[strings.TrimSuffix(name, "-static")] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// binfmtInterpreters returns the interpreter field of each entry of a
// binfmt.d file (":name:type:offset:magic:mask:interpreter:flags"; lines
// starting with '#' or ';' are comments). The magic and mask are
// \x-escaped, so ':' only ever separates fields.
func binfmtInterpreters(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' || l[0] == ';' {
			continue
		}
		fields := strings.Split(l[1:], l[:1])
		if len(fields) < 7 || fields[5] == "" {
			return nil, fmt.Errorf("%s:%d: not a binfmt_misc entry", path, n)
		}
		out = append(out, fields[5])
	}
	return out, sc.Err()
}

// resolveIn follows the symbolic links of p (an absolute path inside the
// guest) within root, as the guest's kernel will, instead of the host's
// view of absolute link targets; the result must be a regular file.
func resolveIn(root, p string) (string, error) {
	for range 40 {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			if !fi.Mode().IsRegular() {
				return "", fmt.Errorf("%s is not a regular file", p)
			}
			return p, nil
		}
		t, err := os.Readlink(filepath.Join(root, p))
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(p), t)
		}
		p = filepath.Clean(t)
	}
	return "", fmt.Errorf("%s: too many levels of symbolic links", p)
}
