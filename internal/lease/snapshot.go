package lease

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/files"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

const (
	memoryFile = "memory.save"
	diskFile   = "disk.qcow2"
)

// Snapshot saves a running lease's memory and disk. libvirt's save stops
// the domain (which flushes its disk); the overlay is copied and the lease
// resumed from the same state, so it runs on as before.
func (m *Manager) Snapshot(ctx context.Context, id string) (*records.LeaseSnapshot, error) {
	l, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	if l.State != records.LeaseBusy && l.State != records.LeaseIdle {
		return nil, fault.Failure(fmt.Errorf("lease %s is %s; only a running lease can be snapshotted", id, l.State))
	}
	c, err := m.connFor(l)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	s := &records.LeaseSnapshot{Lease: l.ID, Host: l.Host, Image: l.Image, ImageSpec: l.ImageSpec, ImageVersion: l.ImageVersion,
		Platform: l.Platform, Accel: l.Accel, Limits: l.Limits, Samples: l.Samples,
		Source: records.SnapshotNetwork{VMName: l.VMName, MAC: l.MAC, IP: l.IP, Tap: l.Tap, Overlay: l.Overlay, Console: l.ConsoleLog}}
	records.Init(s, records.KindSnapshot, m.St.Now())
	s.Dir = m.snapshotDir(s.ID)
	if err := m.mkdirReachable(s.Dir); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(s.Dir)
		}
	}()
	mem := filepath.Join(s.Dir, memoryFile)
	if err := c.SaveDomain(ctx, l.VMName, mem); err != nil {
		return nil, err
	}
	copyErr := files.Copy(l.Overlay, filepath.Join(s.Dir, diskFile))
	// The lease comes back whatever happened to the copy.
	rctx := context.WithoutCancel(ctx)
	if err := m.restoreGuest(rctx, c, l, mem, "", restoredTimeout); err != nil {
		m.finish(ctx, l.ID, records.LeaseFailed, "could not resume after snapshot: "+err.Error())
		return nil, fmt.Errorf("lease %s did not resume after its snapshot (now failed): %w", l.ID, err)
	}
	if copyErr != nil {
		return nil, copyErr
	}
	for _, f := range []struct{ name, role string }{{memoryFile, "memory"}, {diskFile, "disk"}} {
		sum, size, err := files.SHA256(filepath.Join(s.Dir, f.name))
		if err != nil {
			return nil, err
		}
		s.Files = append(s.Files, records.SnapshotFile{Name: f.name, Role: f.role, SHA256: sum, Size: size})
		s.SizeBytes += size
	}
	s.Took = records.Duration(time.Since(start).Round(time.Millisecond))
	if err := m.St.Create(ctx, s); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// Snapshots lists the snapshot records, oldest first.
func (m *Manager) Snapshots() ([]*records.LeaseSnapshot, error) {
	return state.Find[records.LeaseSnapshot](m.St, records.KindSnapshot, nil)
}

// DeleteSnapshot removes a snapshot's files and record.
func (m *Manager) DeleteSnapshot(ctx context.Context, id string) error {
	s, err := m.getSnapshot(id)
	if err != nil {
		return err
	}
	if err := m.St.Delete(ctx, s.ID); err != nil {
		return err
	}
	return os.RemoveAll(s.Dir)
}

func (m *Manager) getSnapshot(id string) (*records.LeaseSnapshot, error) {
	if records.KindOf(id) != records.KindSnapshot || records.CheckID(id) != nil {
		return nil, fault.Usage(fmt.Errorf("%q is not a snapshot ID", id))
	}
	var s records.LeaseSnapshot
	if err := m.St.Get(id, &s); err != nil {
		if errors.Is(err, state.ErrNotFound) {
			return nil, fault.Failure(fmt.Errorf("snapshot %s: %w", id, err))
		}
		return nil, err
	}
	return &s, nil
}

// Restore starts a new lease from a snapshot, without a boot: the files'
// checksums are verified first (a damaged snapshot exits 65 and leaves
// nothing behind), the disk is copied to the new lease's overlay, the
// saved guest is resumed under the new lease's name, and the agent moves
// the guest to the new lease's MAC and address. The saved guest has run
// the source lease's samples: the new lease serves only them (an acquire
// for another sample reverts it).
func (m *Manager) Restore(ctx context.Context, id string, r Request) (*records.SandboxLease, error) {
	s, err := m.getSnapshot(id)
	if err != nil {
		return nil, err
	}
	for _, f := range s.Files {
		sum, size, err := files.SHA256(filepath.Join(s.Dir, f.Name))
		if err != nil {
			return nil, fault.DataErr(fmt.Errorf("snapshot %s: %s: %w", s.ID, f.Name, err))
		}
		if sum != f.SHA256 || size != f.Size {
			return nil, fault.DataErr(fmt.Errorf("snapshot %s is damaged: %s has sha256 %s (%d bytes), recorded %s (%d bytes)", s.ID, f.Name, sum, size, f.SHA256, f.Size))
		}
	}
	if _, err := image.Resolve(m.St, s.Image); err != nil {
		return nil, fault.Failure(fmt.Errorf("snapshot %s: its image %s: %w", s.ID, s.Image, err))
	}
	if r.TTL == 0 {
		r.TTL = time.Hour
	}
	if r.Pool == "" {
		r.Pool = "default"
	}
	if r.BootTimeout == 0 {
		r.BootTimeout = time.Minute
	}
	host, ok := m.Cfg.Host(s.Host)
	if !ok {
		return nil, fault.Failure(fmt.Errorf("snapshot %s was taken on host %s, which is not configured", s.ID, s.Host))
	}
	if err := m.contained(ctx, host); err != nil {
		return nil, err
	}
	unlock, err := m.St.Lock(ctx, allocLock)
	if err != nil {
		return nil, err
	}
	all, err := m.Leases()
	if err != nil {
		unlock()
		return nil, err
	}
	if err := m.checkQuota(&r, all); err != nil {
		unlock()
		return nil, err
	}
	l := &records.SandboxLease{State: records.LeaseCreating, Health: records.HealthUnknown, Pool: r.Pool,
		Host: host.Name, ConnectURI: host.URI, Image: s.Image, ImageSpec: s.ImageSpec, ImageVersion: s.ImageVersion,
		Platform: s.Platform, Accel: s.Accel, Bridge: m.Cfg.Bridge, Limits: s.Limits, TTL: records.Duration(r.TTL),
		RestoredFrom: s.ID, Samples: s.Samples, PID: os.Getpid()}
	if r.Plan != nil {
		l.Plan = r.Plan.ID
	}
	records.Init(l, records.KindLease, m.St.Now())
	a, err := m.allocate(live(all), l.ID)
	if err != nil {
		unlock()
		return nil, err
	}
	l.VMName, l.Tap, l.MAC, l.IP, l.Prefix, l.Gateway = vmName(l.ID), a.Tap, a.MAC, a.IP.String(), a.Prefix, a.Gateway.String()
	l.Dir = m.leaseDir(l.ID)
	l.Overlay, l.ConsoleLog = filepath.Join(l.Dir, "overlay.qcow2"), filepath.Join(l.Dir, "console.log")
	unlockAcq, ok, err := m.St.TryLock(ctx, acquireLock(l.ID))
	if err != nil || !ok {
		unlock()
		return nil, fmt.Errorf("acquire lock of %s: %v", l.ID, err)
	}
	defer unlockAcq()
	if err := m.St.Create(ctx, l); err != nil {
		unlock()
		return nil, err
	}
	unlock()

	fail := func(err error) (*records.SandboxLease, error) {
		m.finish(ctx, l.ID, records.LeaseFailed, err.Error())
		return nil, fault.Failure(fmt.Errorf("restoring %s as lease %s: %w", s.ID, l.ID, err))
	}
	c, err := m.connFor(l)
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	if err := m.mkdirReachable(l.Dir); err != nil {
		return fail(err)
	}
	if err := files.Copy(filepath.Join(s.Dir, diskFile), l.Overlay); err != nil {
		return fail(err)
	}
	saved, err := c.SavedXML(filepath.Join(s.Dir, memoryFile))
	if err != nil {
		return fail(err)
	}
	newXML, err := m.rewriteSaved(saved, s, l)
	if err != nil {
		return fail(err)
	}
	// libvirt refuses a restore XML whose UUID or MAC differs from the
	// saved one, and two live domains cannot share a UUID: the lease gets
	// its own save file with the new definition in its header.
	own := filepath.Join(l.Dir, memoryFile)
	if err := rewriteSaveImage(filepath.Join(s.Dir, memoryFile), own, newXML); err != nil {
		return fail(err)
	}
	// Resumed once its tap is bound: until it is re-addressed the guest has
	// the saved guest's MAC and address, whose frames the binding drops.
	if err := m.restoreGuest(ctx, c, l, own, readdressScript(l), r.BootTimeout); err != nil {
		return fail(err)
	}
	os.Remove(own)
	now := m.St.Now()
	m.update(ctx, l.ID, func(x *records.SandboxLease) error { x.StartedAt = &now; return nil })
	if err := checkAddress(ctx, virt.NewGuest(c, l.VMName, l.ConsoleLog), l.IP); err != nil {
		return fail(err)
	}
	return m.ready(ctx, l.ID, time.Since(start).Round(time.Millisecond), false)
}

// readdressScript moves a restored guest to its lease's MAC and address
// (run by settleRestored). The NIC's MAC is part of the saved device
// state, so the guest sets it (virtio tells QEMU) together with the
// address.
func readdressScript(l *records.SandboxLease) string {
	return fmt.Sprintf("ip link set dev eth0 down && ip link set dev eth0 address %s && ip addr flush dev eth0 && ip addr add %s/%d dev eth0 && ip link set dev eth0 up && ip route replace default via %s",
		l.MAC, l.IP, l.Prefix, l.Gateway)
}

var (
	uuidRe = regexp.MustCompile(`<uuid>[^<]*</uuid>`)
	descRe = regexp.MustCompile(`<description>[^<]*</description>`)
)

// rewriteSaved gives the saved definition the new lease's identity: name,
// UUID, description, overlay, console log, tap, MAC.
func (m *Manager) rewriteSaved(x string, s *records.LeaseSnapshot, l *records.SandboxLease) (string, error) {
	for _, want := range []string{"<name>" + s.Source.VMName + "</name>", s.Source.Overlay, s.Source.Console, s.Source.MAC} {
		if !strings.Contains(x, want) {
			return "", fmt.Errorf("saved definition lacks %q", want)
		}
	}
	var u [16]byte
	rand.Read(u[:])
	u[6], u[8] = u[6]&0x0f|0x40, u[8]&0x3f|0x80
	h := hex.EncodeToString(u[:])
	uuid := h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	var desc strings.Builder
	xml.EscapeText(&desc, []byte(m.description(l.ID)))
	x = strings.Replace(x, "<name>"+s.Source.VMName+"</name>", "<name>"+l.VMName+"</name>", 1)
	x = uuidRe.ReplaceAllString(x, "<uuid>"+uuid+"</uuid>")
	x = descRe.ReplaceAllString(x, "<description>"+desc.String()+"</description>")
	x = strings.ReplaceAll(x, s.Source.Overlay, l.Overlay)
	x = strings.ReplaceAll(x, s.Source.Console, l.ConsoleLog)
	x = strings.ReplaceAll(x, s.Source.MAC, l.MAC)
	x = strings.ReplaceAll(x, "dev='"+s.Source.Tap+"'", "dev='"+l.Tap+"'")
	x = strings.ReplaceAll(x, `dev="`+s.Source.Tap+`"`, `dev="`+l.Tap+`"`)
	x = strings.ReplaceAll(x, "talkbox.ip="+s.Source.IP+"/", "talkbox.ip="+l.IP+"/")
	return x, nil
}

// QEMU save images (libvirt's src/qemu/qemu_saveimage.h, version 2): a
// 92-byte header (magic, version, data_len, was_running, compressed,
// cookieOffset, 14 unused words, host byte order), data_len bytes of
// NUL-terminated domain XML followed by the cookie at cookieOffset, then
// QEMU's migration stream.
const (
	saveMagic      = "LibvirtQemudSave"
	saveHeaderSize = 16 + 4*19
)

// rewriteSaveImage copies a save image with another domain XML.
func rewriteSaveImage(src, dst, domXML string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	hdr := make([]byte, saveHeaderSize)
	if _, err := io.ReadFull(in, hdr); err != nil {
		return fault.DataErr(fmt.Errorf("%s: short save image: %w", src, err))
	}
	if string(hdr[:16]) != saveMagic {
		return fault.DataErr(fmt.Errorf("%s: not a libvirt QEMU save image", src))
	}
	bo := binary.NativeEndian
	version, dataLen, compressed, cookieOff := bo.Uint32(hdr[16:]), bo.Uint32(hdr[20:]), bo.Uint32(hdr[28:]), bo.Uint32(hdr[32:])
	if version != 2 || compressed != 0 {
		return fault.DataErr(fmt.Errorf("%s: save image version %d, compression %d: only uncompressed version 2 is supported", src, version, compressed))
	}
	data := make([]byte, dataLen)
	if _, err := io.ReadFull(in, data); err != nil {
		return fault.DataErr(fmt.Errorf("%s: short save image: %w", src, err))
	}
	var cookie []byte
	if cookieOff > 0 && cookieOff < dataLen {
		cookie = data[cookieOff:]
		if i := bytes.IndexByte(cookie, 0); i >= 0 {
			cookie = cookie[:i+1]
		}
	}
	nd := append([]byte(domXML), 0)
	newCookieOff := uint32(0)
	if cookie != nil {
		newCookieOff = uint32(len(nd))
		nd = append(nd, cookie...)
	}
	// Room for a later in-place definition change, as libvirt leaves.
	nd = append(nd, make([]byte, 1024)...)
	bo.PutUint32(hdr[20:], uint32(len(nd)))
	bo.PutUint32(hdr[32:], newCookieOff)
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := out.Write(hdr); err == nil {
		if _, err = out.Write(nd); err == nil {
			_, err = io.Copy(out, in)
		}
		if err != nil {
			out.Close()
			return err
		}
	}
	return out.Close()
}
