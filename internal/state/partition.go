package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A batch stores its keys in partition files, one per key directory, one
// line per key, instead of one file per key: creating a file is the
// dominant cost of a write on ext4, and a batch of a parse run sets two keys
// for each of hundreds of records. A partition file is only ever appended
// to, under its lock; a line cut short by a crash (a torn tail) is ignored
// by readers and trimmed by the next appender before it writes.
//
//	index/<name>/.batched            "<key> <id>" lines: unique keys (Lookup)
//	keys/<kind>/<field>/<v>/.batched "<id>" lines: records by field (ByKey)
//
// ".batched" is neither an index key nor an ID, so the loose files of the
// same directories (written by single writes) are never confused with it.
const partitionFile = ".batched"

// crashPartitionTorn is where a test kills an append to a partition file
// half written.
const crashPartitionTorn = "partition:torn"

func (s *dirStore) partitionLockPath() string { return filepath.Join(s.root, "locks", "partitions") }

// appendPartition appends lines (each ending in a newline) to the
// partition file in dir, creating it if needed, and returns the offset they
// were written at.
func (s *dirStore) appendPartition(dir string, lines []byte) (at int64, err error) {
	if len(lines) == 0 {
		return 0, nil
	}
	path := filepath.Join(dir, partitionFile)
	unlock, _, err := lockFile(context.Background(), s.partitionLockPath(), lockOffset(path), true)
	if err != nil {
		return 0, err
	}
	defer unlock()
	if err := s.ensureDir(dir); err != nil {
		return 0, err
	}
	fd, err := openRetry(path, unix.O_RDWR|unix.O_CREAT, 0o640)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, pathErr("stat", path, err)
	}
	end, err := trimTorn(fd, path, st.Size)
	if err != nil {
		return 0, err
	}
	at = end
	if s.crashAt != nil {
		half := len(lines) / 2
		if err := pwriteAll(fd, path, lines[:half], end); err != nil {
			return 0, err
		}
		s.hook(crashPartitionTorn)
		end += int64(half)
		lines = lines[half:]
	}
	if err := pwriteAll(fd, path, lines, end); err != nil {
		return 0, err
	}
	if err := s.syncFile(fd, path); err != nil {
		return 0, err
	}
	if st.Size == 0 {
		// Possibly created just now: its directory entry must last too.
		return at, s.syncDir(dir)
	}
	return at, nil
}

// trimTorn cuts a partition file of this size back to its last complete
// line and returns the new size.
func trimTorn(fd int, path string, size int64) (int64, error) {
	if size == 0 {
		return 0, nil
	}
	var buf [4096]byte
	end := size
	for end > 0 {
		n := int64(len(buf))
		if n > end {
			n = end
		}
		if _, err := unix.Pread(fd, buf[:n], end-n); err != nil {
			return 0, pathErr("read", path, err)
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			end = end - n + int64(i) + 1
			break
		}
		end -= n
	}
	if end == size {
		return size, nil
	}
	return end, pathErr("truncate", path, unix.Ftruncate(fd, end))
}

func pwriteAll(fd int, path string, data []byte, off int64) error {
	for len(data) > 0 {
		n, err := unix.Pwrite(fd, data, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return pathErr("write", path, err)
		}
		data, off = data[n:], off+int64(n)
	}
	return nil
}

// partitionLines returns the complete lines of the partition file in dir
// (none if there is none), and the offset after the last of them.
func partitionLines(dir string, from int64) (lines []string, end int64, err error) {
	path := filepath.Join(dir, partitionFile)
	fd, err := openRetry(path, unix.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, from, nil
	}
	if err != nil {
		return nil, from, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, from, pathErr("stat", path, err)
	}
	if st.Size <= from {
		return nil, from, nil
	}
	buf := make([]byte, st.Size-from)
	n := 0
	for n < len(buf) {
		m, err := unix.Pread(fd, buf[n:], from+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, from, pathErr("read", path, err)
		}
		if m == 0 {
			break
		}
		n += m
	}
	buf = buf[:n]
	complete := bytes.LastIndexByte(buf, '\n') + 1
	if complete == 0 {
		return nil, from, nil
	}
	return strings.Split(string(buf[:complete-1]), "\n"), from + int64(complete), nil
}

// keyPart is what this store has read of a key directory's partition file:
// the IDs up to end.
type keyPart struct {
	end int64
	ids map[string]bool
}

// inKeyPartition reports whether the partition file of the key directory
// dir has a line for id, reading only what was appended since the last call.
func (s *dirStore) inKeyPartition(dir, id string) (bool, error) {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, partitionFile), &st); err == unix.ENOENT {
		// No batch stored under this key: nothing to remember, so that a
		// long-running writer's cache holds only the key directories
		// batches wrote, not every one it ever wrote a key in.
		return false, nil
	} else if err != nil {
		return false, pathErr("stat", filepath.Join(dir, partitionFile), err)
	}
	p := s.keyParts[dir]
	if p == nil {
		p = &keyPart{ids: make(map[string]bool)}
		if s.keyParts == nil {
			s.keyParts = make(map[string]*keyPart)
		}
		s.keyParts[dir] = p
	}
	if st.Size <= p.end {
		return p.ids[id], nil
	}
	lines, end, err := partitionLines(dir, p.end)
	if err != nil {
		return false, err
	}
	for _, l := range lines {
		p.ids[l] = true
	}
	p.end = end
	return p.ids[id], nil
}

// indexPart is what this store has read of an index's partition file: the
// keys up to end, each to the ID of its last line.
type indexPart struct {
	end int64
	ids map[string]string
}

// lookupPacked returns the ID a batch last stored under an index key in its
// partition file, reading only what was appended since the last call.
func (s *dirStore) lookupPacked(name, key string) (string, bool, error) {
	return s.lookupPackedAsOf(name, key, false)
}

// lookupPackedAsOf is lookupPacked without reading the partition lines
// again when fresh: the caller read them after it took the key's lock, so
// that no line for it can have been appended since.
func (s *dirStore) lookupPackedAsOf(name, key string, fresh bool) (string, bool, error) {
	dir := filepath.Join(s.root, "index", name)
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	p := s.parts[name]
	if fresh && p != nil {
		id, ok := p.ids[key]
		return id, ok, nil
	}
	if p == nil {
		p = &indexPart{ids: make(map[string]string)}
		if s.parts == nil {
			s.parts = make(map[string]*indexPart)
		}
		s.parts[name] = p
	}
	var st unix.Stat_t
	err := unix.Stat(filepath.Join(dir, partitionFile), &st)
	if err == nil && st.Size > p.end {
		lines, end, err := partitionLines(dir, p.end)
		if err != nil {
			return "", false, err
		}
		for _, l := range lines {
			// A line that does not parse is not a key: SetIndex checks
			// every key and ID before it is written.
			if k, id, ok := strings.Cut(l, " "); ok {
				p.ids[k] = id
			}
		}
		p.end = end
	} else if err != nil && err != unix.ENOENT {
		return "", false, pathErr("stat", filepath.Join(dir, partitionFile), err)
	}
	id, ok := p.ids[key]
	return id, ok, nil
}

// partLines collects lines to append to the partition files of a few
// directories, in buffers kept from one use to the next (a batch's keys:
// most of its lines go to one or two directories).
type partLines struct{ dirs []dirLines }

type dirLines struct {
	dir   string
	lines []byte
}

// reset empties the buffers; past a few directories, it forgets them.
func (p *partLines) reset() {
	if len(p.dirs) > 8 {
		p.dirs = p.dirs[:0]
	}
	for i := range p.dirs {
		p.dirs[i].lines = p.dirs[i].lines[:0]
	}
}

// of returns dir's buffer.
func (p *partLines) of(dir string) *[]byte {
	for i := range p.dirs {
		if p.dirs[i].dir == dir {
			return &p.dirs[i].lines
		}
	}
	p.dirs = append(p.dirs, dirLines{dir: dir})
	return &p.dirs[len(p.dirs)-1].lines
}

// appendTo appends each directory's lines to its partition file, in the
// order the directories were first used.
func (p *partLines) appendTo(s *dirStore) error {
	for _, d := range p.dirs {
		if _, err := s.appendPartition(d.dir, d.lines); err != nil {
			return fmt.Errorf("%s: %w", d.dir, err)
		}
	}
	return nil
}
