package state

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The write path calls these instead of the os package: os.OpenFile spends
// five extra system calls per file trying to register it with the network
// poller, and os.Rename one more checking the target is not a directory. At
// tens of system calls per record, that was a third of a write's cost.

func pathErr(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}

func openRetry(path string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, mode)
		if err != unix.EINTR {
			return fd, pathErr("open", path, err)
		}
	}
}

// readFile reads a small file whole.
func readFile(path string) ([]byte, error) {
	fd, err := openRetry(path, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, pathErr("stat", path, err)
	}
	buf := make([]byte, 0, st.Size+1)
	for {
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, pathErr("read", path, err)
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
	}
}

// writeAll writes data to fd, fsyncing it when sync is set.
func writeAll(fd int, path string, data []byte, sync bool) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return pathErr("write", path, err)
		}
		data = data[n:]
	}
	if sync {
		return pathErr("fsync", path, unix.Fsync(fd))
	}
	return nil
}

// createFile creates (or truncates) path with data.
func createFile(path string, data []byte, sync bool) error {
	fd, err := openRetry(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	if err := writeAll(fd, path, data, sync); err != nil {
		unix.Close(fd)
		return err
	}
	return pathErr("close", path, unix.Close(fd))
}

// createTemp creates a new file with a random name in dir.
func createTemp(dir, prefix string) (*os.File, error) {
	var b [8]byte
	for {
		rand.Read(b[:])
		path := filepath.Join(dir, prefix+hex.EncodeToString(b[:]))
		fd, err := openRetry(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err == nil {
			return os.NewFile(uintptr(fd), path), nil
		}
		if !os.IsExist(err) {
			return nil, err
		}
	}
}

func rename(from, to string) error {
	if err := unix.Rename(from, to); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}
