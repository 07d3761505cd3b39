package virt

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestLocalURI: the gdbstub's socket is a file of this machine, so only a
// libvirtd here may have its guests' timers re-armed.
func TestLocalURI(t *testing.T) {
	for uri, want := range map[string]bool{
		"": true, "qemu:///system": true, "qemu+unix:///system?socket=/run/x/libvirt-sock": true,
		"qemu+tcp://203.0.113.2/system": false, "qemu+ssh://root@host/system": false, "system": false,
	} {
		if got := LocalURI(uri); got != want {
			t.Errorf("LocalURI(%q) = %v, want %v", uri, got, want)
		}
	}
}

// TestQEMUOwner: the socket's directory is given to the user QEMU runs
// as, read from the live definition's DAC label.
func TestQEMUOwner(t *testing.T) {
	x := `<domain><seclabel type='dynamic' model='apparmor'><label>libvirt-x</label></seclabel>` +
		`<seclabel type='dynamic' model='dac' relabel='yes'><label>+64055:+108</label></seclabel></domain>`
	if uid, gid, err := qemuOwner(x); err != nil || uid != 64055 || gid != 108 {
		t.Errorf("qemuOwner: %d:%d, %v", uid, gid, err)
	}
	if uid, gid, err := qemuOwner(`<domain/>`); err != nil || uid != 0 || gid != 0 {
		t.Errorf("qemuOwner without a label: %d:%d, %v", uid, gid, err)
	}
	if _, _, err := qemuOwner(`<domain><seclabel model='dac'><label>qemu</label></seclabel></domain>`); err == nil {
		t.Error("qemuOwner took a label that is not +UID:+GID")
	}
}

// fakeStub answers the GDB remote protocol on a Unix socket as QEMU's MIPS
// gdbstub does, for one 32-bit little-endian vCPU, through answer, which
// may lie: the client must refuse what it did not ask for.
func fakeStub(t *testing.T, answer func(req string, regs []byte) string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "gdb.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		regs := make([]byte, (causeReg+1)*4+16)
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('$'); err != nil {
				return
			}
			req, err := r.ReadString('#')
			if err != nil {
				return
			}
			req = req[:len(req)-1]
			if _, err := io.ReadFull(r, make([]byte, 2)); err != nil {
				return
			}
			out := answer(req, regs)
			fmt.Fprintf(c, "+$%s#%02x", out, checksum(out))
		}
	}()
	return sock
}

// honest is a stub whose vCPU takes what G writes.
func honest(req string, regs []byte) string {
	switch {
	case req == "qfThreadInfo":
		return "m1"
	case req == "qsThreadInfo":
		return "l"
	case strings.HasPrefix(req, "Hg"):
		return "OK"
	case req == "g":
		return hex.EncodeToString(regs)
	case strings.HasPrefix(req, "G"):
		b, err := hex.DecodeString(req[1:])
		if err != nil || len(b) > len(regs) {
			return "E01"
		}
		copy(regs, b)
		return "OK"
	}
	return ""
}

// TestToggleDC: the re-arm sets and clears Cause.DC and reads each write
// back; a stub that answers a register block too short to hold Cause,
// one that is not hex, or a CPU that ignores the bit is an error, never a re-arm reported done.
func TestToggleDC(t *testing.T) {
	ctx := context.Background()
	var writes []uint32
	sock := fakeStub(t, func(req string, regs []byte) string {
		if strings.HasPrefix(req, "G") {
			b, _ := hex.DecodeString(req[1:])
			writes = append(writes, binary.LittleEndian.Uint32(b[causeReg*4:]))
		}
		return honest(req, regs)
	})
	if err := toggleDC(ctx, sock, 4, binary.LittleEndian); err != nil {
		t.Fatal(err)
	}
	if len(writes) != 2 || writes[0] != causeDC || writes[1] != 0 {
		t.Fatalf("Cause written %#x, want DC set then cleared", writes)
	}
	for name, lie := range map[string]func(string, []byte) string{
		"ignores DC": func(req string, regs []byte) string {
			if strings.HasPrefix(req, "G") {
				return "OK"
			}
			return honest(req, regs)
		},
		"short registers": func(req string, regs []byte) string {
			if req == "g" {
				return hex.EncodeToString(regs[:causeReg*4])
			}
			return honest(req, regs)
		},
		"not hex": func(req string, regs []byte) string {
			if req == "g" {
				return strings.Repeat("zz", len(regs))
			}
			return honest(req, regs)
		},
	} {
		if err := toggleDC(ctx, fakeStub(t, lie), 4, binary.LittleEndian); err == nil {
			t.Errorf("%s: the re-arm reported done", name)
		}
	}
}
