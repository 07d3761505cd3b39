// Package yarascan runs an analyst's YARA rules over the files Talkbox
// keeps: samples, dropped files and memory dumps.
//
// It runs Debian's yara program, as the sensors run tcpdump, rather than
// libyara through a cgo binding: the tools stay static binaries without
// cgo (only the libvirt ones use it), the scan is libyara's own speed (the
// program is a thin loop over the library; docs/performance.md has the
// figure), and a rule set is compiled once per run with yarac, so each
// scan is one process start and one read of the file.
//
//	rules, err := yarascan.Compile(ctx, dirs) // *.yar and *.yara under each dir
//	defer rules.Close()
//	ms, err := rules.Scan(ctx, path)          // the rules that match the file
package yarascan

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// SystemDir is the host's rule directory, read when it exists.
const SystemDir = "/etc/talkbox/yara"

// MaxStrings is how many string matches of one rule are kept.
const MaxStrings = 64

// ErrNoYara: the yara program is not installed (exit 69).
var ErrNoYara = errors.New("yara and yarac not found: install Debian's yara package (scripts/deps.sh does)")

// Rules are compiled rules, in a temporary file Close removes.
type Rules struct {
	dir      string
	compiled string
	// Files are the rule files, in the order compiled.
	Files []string
}

// Dirs are the rule directories of a run: SystemDir when it exists, then
// those given (a profile's, the command line's), without repeats.
func Dirs(given ...string) []string {
	var dirs []string
	if st, err := os.Stat(SystemDir); err == nil && st.IsDir() {
		dirs = append(dirs, SystemDir)
	}
	for _, d := range given {
		if d != "" && !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// Compile compiles every *.yar and *.yara file under dirs (a file may be
// given as a dir too) into one rule set; each file is a namespace named by
// its path under its directory, without the extension. No rule files: nil
// Rules, no error. A rule that does not compile is bad data (exit 65),
// named with its file and line.
func Compile(ctx context.Context, dirs []string) (*Rules, error) {
	var args, files []string
	for _, d := range dirs {
		st, err := os.Stat(d)
		if err != nil {
			return nil, fault.Usage(fmt.Errorf("yara rules: %w", err))
		}
		root := d
		if !st.IsDir() {
			root = filepath.Dir(d)
		}
		err = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() || (filepath.Ext(p) != ".yar" && filepath.Ext(p) != ".yara") {
				return nil
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			ns := strings.TrimSuffix(filepath.ToSlash(rel), filepath.Ext(rel))
			// yarac takes NAMESPACE:FILE; a colon in a namespace would be
			// read as the separator.
			ns = strings.NewReplacer(":", "_", " ", "_").Replace(ns)
			files = append(files, p)
			args = append(args, ns+":"+p)
			return nil
		})
		if err != nil {
			return nil, fault.Usage(fmt.Errorf("yara rules: %w", err))
		}
	}
	if len(files) == 0 {
		return nil, nil
	}
	yarac, err := exec.LookPath("yarac")
	if err != nil {
		return nil, fault.Unavailable(ErrNoYara)
	}
	if _, err := exec.LookPath("yara"); err != nil {
		return nil, fault.Unavailable(ErrNoYara)
	}
	dir, err := os.MkdirTemp("", "talkbox-yara-")
	if err != nil {
		return nil, err
	}
	r := &Rules{dir: dir, compiled: filepath.Join(dir, "rules.yarc"), Files: files}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, yarac, append(append([]string{"-w"}, args...), r.compiled)...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		r.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// yarac: "FILE(LINE): error: …", one line per error.
		first, _, _ := strings.Cut(strings.TrimSpace(stderr.String()), "\n")
		return nil, fault.DataErr(fmt.Errorf("yara rules do not compile: %s", first))
	}
	return r, nil
}

// Close removes the compiled rules.
func (r *Rules) Close() {
	if r != nil {
		os.RemoveAll(r.dir)
	}
}

// Scan runs the rules over the file at path. Its bytes are the sample's:
// the matched data yara prints is never read, only each match's
// identifier and offset.
func (r *Rules) Scan(ctx context.Context, path string) ([]records.YaraMatch, error) {
	if r == nil {
		return nil, nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	// -C compiled rules, -s strings, -m meta, -g tags, -e namespaces,
	// -w no warnings, -N no symlinks followed.
	cmd := exec.CommandContext(ctx, "yara", "-C", "-s", "-m", "-g", "-e", "-w", "-N", r.compiled, abs)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		first, _, _ := strings.Cut(strings.TrimSpace(stderr.String()), "\n")
		return nil, fmt.Errorf("yara %s: %v: %s", path, err, first)
	}
	return parse(stdout.Bytes(), abs)
}

// parse reads yara's output for one file: a header line per matching rule,
// "NS:RULE [TAGS] [META] PATH", then its strings, "0xOFFSET:$ID: DATA".
func parse(out []byte, path string) ([]records.YaraMatch, error) {
	var ms []records.YaraMatch
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "0x") && len(ms) > 0 {
			off, rest, ok := strings.Cut(line[2:], ":")
			if !ok {
				continue
			}
			id, _, _ := strings.Cut(rest, ":")
			n, err := strconv.ParseInt(off, 16, 64)
			m := &ms[len(ms)-1]
			if err == nil && strings.HasPrefix(id, "$") && len(m.Strings) < MaxStrings {
				m.Strings = append(m.Strings, records.YaraString{ID: id, Offset: n})
			}
			continue
		}
		head, ok := strings.CutSuffix(line, " "+path)
		if !ok {
			return nil, fmt.Errorf("yara printed an unexpected line: %.80q", line)
		}
		m, err := parseHeader(head)
		if err != nil {
			return nil, fmt.Errorf("yara printed %.80q: %w", line, err)
		}
		ms = append(ms, m)
	}
	return ms, sc.Err()
}

// parseHeader reads "NS:RULE [TAG,…] [KEY=VALUE,…]".
func parseHeader(s string) (records.YaraMatch, error) {
	var m records.YaraMatch
	name, rest, ok := strings.Cut(s, " [")
	if !ok {
		return m, errors.New("no tag list")
	}
	m.Namespace, m.Rule, ok = strings.Cut(name, ":")
	if !ok {
		return m, errors.New("no namespace")
	}
	tags, rest, ok := strings.Cut(rest, "] [")
	if !ok {
		return m, errors.New("no meta list")
	}
	if tags != "" {
		m.Tags = strings.Split(tags, ",")
	}
	meta, ok := strings.CutSuffix(rest, "]")
	if !ok {
		return m, errors.New("meta list not closed")
	}
	var err error
	m.Meta, err = parseMeta(meta)
	return m, err
}

// parseMeta reads yara's meta list: KEY="TEXT" (with \" and \\ escapes),
// KEY =NUMBER, KEY=true|false, separated by commas.
func parseMeta(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	meta := map[string]string{}
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return nil, fmt.Errorf("meta %.40q: no value", s)
		}
		key := strings.TrimSpace(s[:eq])
		s = s[eq+1:]
		var val string
		if strings.HasPrefix(s, `"`) {
			var b strings.Builder
			i := 1
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				b.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, fmt.Errorf("meta %s: string not closed", key)
			}
			val, s = b.String(), s[i+1:]
		} else {
			end := strings.IndexByte(s, ',')
			if end < 0 {
				end = len(s)
			}
			val, s = s[:end], s[end:]
		}
		meta[key] = val
		s = strings.TrimPrefix(s, ",")
	}
	return meta, nil
}
