package virt

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
)

// A MIPS guest restored from a save under TCG has no timer interrupt.
//
// QEMU 7.2 saves a MIPS CPU's CP0 Count and Compare but not the host timer
// that raises the compare interrupt, and arms nothing when it loads them:
// a guest saved while a timer event was due (every guest just booted has
// one) gets no timer interrupt until its kernel writes Compare again,
// which it does only from that interrupt. QEMU re-arms the timer whenever
// Cause.DC (disable count) goes from 1 to 0, and its gdbstub writes Cause
// through the same function as the guest's own mtc0. So RearmMIPSTimer
// starts the gdbstub of a paused guest on a socket of the host, sets DC
// and clears it again (while the guest is paused its clock stands still,
// so Count goes on where it stood), and stops the gdbstub.
//
// The gdbstub is QEMU's, on the host: the guest has no way to it. Its
// socket is in a directory of its own that only root and the guest's QEMU
// process (which creates it) may enter, and is gone before the guest runs.

// causeDC is Cause's disable-count bit.
const causeDC = 1 << 27

// causeReg is Cause's index among QEMU's MIPS gdb registers: 32 general
// registers, then Status, LO, HI, BadVAddr, Cause.
const causeReg = 36

// gdbTimeout bounds the whole exchange with the gdbstub: a handful of
// packets on a local socket.
const gdbTimeout = 10 * time.Second

// LocalURI tells whether uri is a libvirtd on this machine, whose guests'
// QEMU processes share this machine's files (RearmMIPSTimer needs that).
func LocalURI(uri string) bool {
	if uri == "" {
		return true
	}
	_, rest, ok := strings.Cut(uri, "://")
	return ok && strings.HasPrefix(rest, "/")
}

// RearmMIPSTimer re-arms the compare timer of the paused MIPS guest name
// (see above). regBytes is the guest's register width (4 on a 32-bit CPU,
// 8 on a 64-bit one) and order its byte order. The guest must be paused
// and stays so: nothing here resumes it.
func (l *Libvirt) RearmMIPSTimer(ctx context.Context, name string, regBytes int, order binary.ByteOrder) error {
	if !LocalURI(l.uri) {
		return fmt.Errorf("re-arming the timer of %s: its host %s is not this machine", name, l.uri)
	}
	ctx, cancel := context.WithTimeout(ctx, gdbTimeout)
	defer cancel()
	d, err := l.conn.LookupDomainByName(name)
	if err != nil {
		return fmt.Errorf("looking up guest %s: %s", name, message(err))
	}
	defer d.Free()
	dir, err := gdbDir(d)
	if err != nil {
		return fmt.Errorf("re-arming the timer of %s: %w", name, err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "gdb.sock")
	hmp := func(cmd string) (string, error) {
		out, err := d.QemuMonitorCommand(cmd, libvirt.DOMAIN_QEMU_MONITOR_COMMAND_HMP)
		if err != nil {
			return "", fmt.Errorf("%s: %s", cmd, message(err))
		}
		return out, nil
	}
	out, err := hmp("gdbserver unix:" + sock + ",server=on,wait=off")
	if err == nil && !strings.Contains(out, "Waiting for gdb connection") {
		err = fmt.Errorf("starting the gdbstub: %s", strings.TrimSpace(out))
	}
	if err != nil {
		return fmt.Errorf("re-arming the timer of %s: %w", name, err)
	}
	err = toggleDC(ctx, sock, regBytes, order)
	if _, serr := hmp("gdbserver none"); err == nil && serr != nil {
		err = fmt.Errorf("stopping the gdbstub: %w", serr)
	}
	if err != nil {
		return fmt.Errorf("re-arming the timer of %s: %w", name, err)
	}
	return nil
}

// gdbDir makes the directory of the gdbstub's socket: root's, and
// the guest's QEMU process's, which runs as its DAC label's user and must
// create the socket in it.
func gdbDir(d *libvirt.Domain) (string, error) {
	x, err := d.GetXMLDesc(0)
	if err != nil {
		return "", fmt.Errorf("the guest's definition: %s", message(err))
	}
	uid, gid, err := qemuOwner(x)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("/run", "talkbox-gdb.")
	if err != nil {
		return "", err
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// qemuOwner is the user and group a running domain's QEMU runs as, from
// the DAC security label in its live definition (root's without one).
func qemuOwner(domXML string) (uid, gid int, err error) {
	var dom struct {
		SecLabels []struct {
			Model string `xml:"model,attr"`
			Label string `xml:"label"`
		} `xml:"seclabel"`
	}
	if err := xml.Unmarshal([]byte(domXML), &dom); err != nil {
		return 0, 0, fmt.Errorf("the guest's definition: %w", err)
	}
	for _, s := range dom.SecLabels {
		if s.Model != "dac" {
			continue
		}
		u, g, ok := strings.Cut(s.Label, ":")
		uid, uerr := strconv.Atoi(strings.TrimPrefix(u, "+"))
		gid, gerr := strconv.Atoi(strings.TrimPrefix(g, "+"))
		if !ok || uerr != nil || gerr != nil {
			return 0, 0, fmt.Errorf("the guest's DAC label %q is not +UID:+GID", s.Label)
		}
		return uid, gid, nil
	}
	return 0, 0, nil
}

// toggleDC sets Cause.DC of every vCPU behind the gdbstub at sock and
// clears it again (or the other way round where a guest had it set),
// checking each write.
func toggleDC(ctx context.Context, sock string, regBytes int, order binary.ByteOrder) error {
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", sock)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	g := &gdbClient{rw: bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))}
	threads, err := g.threads()
	if err != nil {
		return err
	}
	for _, t := range threads {
		if err := g.expectOK("Hg" + t); err != nil {
			return fmt.Errorf("selecting vCPU %s: %w", t, err)
		}
		regs, err := g.generalRegs(regBytes)
		if err != nil {
			return fmt.Errorf("vCPU %s: %w", t, err)
		}
		cause := regs[causeReg*regBytes : (causeReg+1)*regBytes]
		was := regValue(cause, order)
		// Each write is read back: a CPU without the DC bit (before
		// MIPS32/64 release 2) ignores it, and nothing is re-armed.
		for _, v := range []uint64{was ^ causeDC, was} {
			putRegValue(cause, order, v)
			if err := g.expectOK("G" + hex.EncodeToString(regs)); err != nil {
				return fmt.Errorf("writing Cause of vCPU %s: %w", t, err)
			}
			after, err := g.generalRegs(regBytes)
			if err != nil {
				return fmt.Errorf("vCPU %s: %w", t, err)
			}
			if now := regValue(after[causeReg*regBytes:(causeReg+1)*regBytes], order); now&causeDC != v&causeDC {
				return fmt.Errorf("vCPU %s: Cause is %#x after writing %#x: its disable-count bit did not change", t, now, v)
			}
		}
	}
	return nil
}

func regValue(b []byte, order binary.ByteOrder) uint64 {
	if len(b) == 4 {
		return uint64(order.Uint32(b))
	}
	return order.Uint64(b)
}

func putRegValue(b []byte, order binary.ByteOrder, v uint64) {
	if len(b) == 4 {
		order.PutUint32(b, uint32(v))
		return
	}
	order.PutUint64(b, v)
}

// gdbClient speaks the part of the GDB remote serial protocol that
// toggleDC needs, acknowledged mode: `$data#checksum`, each packet
// answered with `+`.
type gdbClient struct {
	rw *bufio.ReadWriter
}

// call sends one packet and returns the reply's data.
func (g *gdbClient) call(data string) (string, error) {
	fmt.Fprintf(g.rw, "$%s#%02x", data, checksum(data))
	if err := g.rw.Flush(); err != nil {
		return "", err
	}
	for {
		b, err := g.rw.ReadByte()
		if err != nil {
			return "", fmt.Errorf("gdbstub: %w", err)
		}
		switch b {
		case '+':
			continue
		case '-':
			return "", errors.New("gdbstub: packet refused")
		case '$':
			return g.reply()
		}
	}
}

// reply reads a packet's data after its `$`, checks its checksum and
// acknowledges it.
func (g *gdbClient) reply() (string, error) {
	data, err := g.rw.ReadString('#')
	if err != nil {
		return "", fmt.Errorf("gdbstub: %w", err)
	}
	data = data[:len(data)-1]
	var cs [2]byte
	if _, err := io.ReadFull(g.rw, cs[:]); err != nil {
		return "", fmt.Errorf("gdbstub: %w", err)
	}
	want, err := strconv.ParseUint(string(cs[:]), 16, 8)
	if err != nil || byte(want) != checksum(data) {
		return "", fmt.Errorf("gdbstub: bad checksum %q", cs[:])
	}
	if strings.ContainsAny(data, "*}") {
		return "", fmt.Errorf("gdbstub: an encoded reply, not asked for: %.40q", data)
	}
	if err := g.rw.WriteByte('+'); err != nil {
		return "", err
	}
	return data, g.rw.Flush()
}

func (g *gdbClient) expectOK(data string) error {
	r, err := g.call(data)
	if err == nil && r != "OK" {
		err = fmt.Errorf("gdbstub answered %.40q to %.20q", r, data)
	}
	return err
}

// threads lists the gdbstub's threads: the guest's vCPUs.
func (g *gdbClient) threads() ([]string, error) {
	var ids []string
	for q := "qfThreadInfo"; ; q = "qsThreadInfo" {
		r, err := g.call(q)
		if err != nil {
			return nil, err
		}
		if r == "l" {
			break
		}
		if !strings.HasPrefix(r, "m") {
			return nil, fmt.Errorf("gdbstub answered %.40q to %s", r, q)
		}
		ids = append(ids, strings.Split(r[1:], ",")...)
	}
	if len(ids) == 0 {
		return nil, errors.New("gdbstub lists no vCPU")
	}
	return ids, nil
}

// generalRegs reads registers 0 to Cause of the selected vCPU. QEMU's
// gdbstub answers `p` (one register) only to a client that read its
// target description, which MIPS has none of, so the registers are read
// and written as a block with `g` and `G`; a `G` shorter than the whole
// block writes only the registers it holds.
func (g *gdbClient) generalRegs(regBytes int) ([]byte, error) {
	r, err := g.call("g")
	if err != nil {
		return nil, err
	}
	regs, err := hex.DecodeString(r)
	if err != nil {
		return nil, fmt.Errorf("gdbstub's registers: %w", err)
	}
	n := (causeReg + 1) * regBytes
	if len(regs) < n {
		return nil, fmt.Errorf("gdbstub's registers: %d bytes, not the %d up to Cause", len(regs), n)
	}
	return regs[:n], nil
}

func checksum(s string) byte {
	var c byte
	for i := 0; i < len(s); i++ {
		c += s[i]
	}
	return c
}
