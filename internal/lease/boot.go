package lease

import (
	"cmp"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/crashhook"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// domainXML renders the lease's domain: the image's direct kernel boot
// with the lease's address on the kernel command line, its disk overlay,
// tap, MAC, console log and limits.
func (m *Manager) domainXML(l *records.SandboxLease, img *records.SandboxImage) (string, error) {
	b := img.Boot
	emu := b.Emulator
	if p, err := exec.LookPath(emu); err == nil {
		emu = p
	} else if !filepath.IsAbs(emu) {
		emu = "/usr/bin/" + emu
	}
	// The lease's parameters go first: QEMU's Malta board hands the kernel
	// at most 255 bytes of command line and drops the rest.
	cmdline := image.LeaseCmdline(cmp.Or(b.Interface, "eth0"), l.IP, l.Prefix, l.Gateway) + " " + b.Cmdline
	x, err := virt.DomainXML(virt.DomainConfig{
		Name: l.VMName, Accel: virt.Accel(l.Accel), Emulator: emu, Arch: b.Arch, Machine: b.Machine, CPU: b.CPU,
		MemoryMiB: l.Limits.MemoryMiB, VCPUs: l.Limits.VCPUs,
		Kernel: filepath.Join(img.Dir, b.Kernel), Initrd: filepath.Join(img.Dir, b.Initrd), Cmdline: cmdline,
		Disks:      []virt.Disk{{Path: l.Overlay, Format: "qcow2", Bus: b.DiskBus}},
		ConsoleLog: l.ConsoleLog,
		NICs:       []virt.NIC{{Bridge: l.Bridge, MAC: l.MAC, Model: b.NetModel}},
	})
	if err != nil {
		return "", err
	}
	var desc strings.Builder
	xml.EscapeText(&desc, []byte(m.description(l.ID)))
	extra := "<description>" + desc.String() + "</description>"
	if q := l.Limits.CPUQuota; q > 0 {
		extra += "<cputune><period>100000</period><quota>" + strconv.Itoa(q*1000) + "</quota></cputune>"
	}
	nameTag := "<name>" + l.VMName + "</name>"
	if !strings.Contains(x, nameTag) || !strings.Contains(x, `<interface type="bridge">`) {
		return "", fmt.Errorf("unexpected domain XML from virt.DomainXML")
	}
	x = strings.Replace(x, nameTag, nameTag+extra, 1)
	x = strings.Replace(x, `<interface type="bridge">`, `<interface type="bridge"><target dev="`+l.Tap+`"></target>`, 1)
	return x, nil
}

// boot makes the overlay, starts the domain and waits for the guest agent.
// On failure the domain and overlay are removed and the lease is failed
// with the console's tail. restart reuses an existing overlay.
func (m *Manager) boot(ctx context.Context, l *records.SandboxLease, img *records.SandboxImage, timeout time.Duration, restart bool) (*records.SandboxLease, error) {
	fail := func(err error) (*records.SandboxLease, error) {
		tail := ""
		var be *virt.BootError
		if errors.As(err, &be) {
			tail = be.Console
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (interrupted)", err)
		}
		if fl, ferr := m.finish(ctx, l.ID, records.LeaseFailed, err.Error()); ferr == nil && tail != "" {
			m.update(context.WithoutCancel(ctx), fl.ID, func(x *records.SandboxLease) error { x.ConsoleTail = tail; return nil })
		}
		return nil, fault.Failure(fmt.Errorf("lease %s failed: %w", l.ID, err))
	}
	c, err := m.connFor(l)
	if err != nil {
		return fail(err)
	}
	if err := m.mkdirReachable(l.Dir); err != nil {
		return fail(err)
	}
	log := cmp.Or(m.Out.Log, slog.New(slog.DiscardHandler)).With("lease", l.ID)
	if _, err := os.Stat(l.Overlay); !restart || err != nil {
		log.Info("creating the disk overlay", "phase", "disk")
		args := []string{"create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", filepath.Join(img.Dir, img.Boot.Disk), l.Overlay}
		if l.Limits.DiskGiB > 0 {
			args = append(args, strconv.Itoa(l.Limits.DiskGiB)+"G")
		}
		os.Remove(l.Overlay)
		if err := qemuImg(ctx, args...); err != nil {
			return fail(err)
		}
	}
	os.Remove(l.ConsoleLog)
	x, err := m.domainXML(l, img)
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	log.Info("starting the guest", "phase", "start", "host", l.Host)
	if err := m.run(ctx, c, l, func() error { return c.CreatePaused(ctx, x) }); err != nil {
		return fail(err)
	}
	now := m.St.Now()
	if _, err := m.update(ctx, l.ID, func(x *records.SandboxLease) error { x.StartedAt = &now; return nil }); err != nil {
		return fail(err)
	}
	crashhook.At(ctx, CrashEnv, "start")
	g := virt.NewGuest(c, l.VMName, l.ConsoleLog)
	log.Info("waiting for the guest agent", "phase", "boot", "timeout", timeout)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	err = g.WaitAgent(wctx)
	cancel()
	if err != nil {
		return fail(err)
	}
	took := time.Since(start).Round(time.Millisecond)
	if err := agentAnswered(ctx, c, l, img); err != nil {
		return fail(err)
	}
	log.Info("guest agent up; checking the address", "phase", "network", "took", took)
	if err := checkAddress(ctx, g, l.IP); err != nil {
		return fail(err)
	}
	return m.ready(ctx, l.ID, took, restart)
}

// checkAddress confirms the guest has its lease address.
func checkAddress(ctx context.Context, g *virt.Guest, ip string) error {
	ifs, err := g.Interfaces(ctx)
	if err != nil {
		return err
	}
	var seen []string
	for _, i := range ifs {
		for _, a := range i.Addresses {
			if strings.HasPrefix(a, ip+"/") {
				return nil
			}
			seen = append(seen, i.Name+"="+a)
		}
	}
	return fmt.Errorf("guest does not have its lease address %s (agent reports %s)", ip, strings.Join(seen, " "))
}

// ready marks a started lease busy and healthy, with its TTL running.
func (m *Manager) ready(ctx context.Context, id string, took time.Duration, restart bool) (*records.SandboxLease, error) {
	now := m.St.Now()
	return m.update(ctx, id, func(x *records.SandboxLease) error {
		if !restart {
			exp := now.Add(x.TTL.D())
			x.State, x.AcquiredAt, x.ExpiresAt = records.LeaseBusy, &now, &exp
			x.Acquisitions++
		}
		x.Health, x.BootToAgent, x.PID, x.Error = records.HealthHealthy, records.Duration(took), 0, ""
		return nil
	})
}
