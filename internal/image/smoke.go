package image

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// Smoke is one smoke test: boot the image on a throw-away overlay in a real
// VM on an isolated network and check the agent, the network and the
// spec's commands.
type Smoke struct {
	H     virt.Hypervisor
	Accel virt.Accel
	Spec  *Spec
	// Dir is the image directory (disk, kernel, initrd); Work receives the
	// overlay and the console log.
	Dir, Work string
	Name      string
	Boot      records.ImageBoot
	Log       io.Writer
}

// SmokeNetwork is the isolated network a spec's static address lives on: a
// bridge with no uplink and no host address, so the guest's gateway leads
// nowhere and nothing the guest sends reaches anything real.
func SmokeNetwork(n NetworkSpec) (virt.NetworkConfig, error) {
	pfx, err := netip.ParsePrefix(n.Address)
	if err != nil {
		return virt.NetworkConfig{}, err
	}
	masked := pfx.Masked()
	name := "talkbox-smoke-" + strings.NewReplacer(".", "-", "/", "-").Replace(masked.String())
	h := sha256.Sum256([]byte(name))
	return virt.NetworkConfig{
		Name:   name,
		Bridge: "tbsm-" + hex.EncodeToString(h[:4]),
	}, nil
}

func randomMAC() string {
	var b [3]byte
	rand.Read(b[:])
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", b[0], b[1], b[2])
}

// Run boots the guest and checks it. The result says what passed; the
// error is the first thing that failed.
func (s *Smoke) Run(ctx context.Context) (*records.SmokeResult, error) {
	res := &records.SmokeResult{Accel: string(s.Accel)}
	fail := func(err error) (*records.SmokeResult, error) {
		res.Error = err.Error()
		var be *virt.BootError
		if errors.As(err, &be) {
			res.ConsoleTail = be.Console
		}
		return res, err
	}
	if err := checkReachable(s.Work); err != nil {
		return fail(err)
	}
	overlay := filepath.Join(s.Work, "overlay.qcow2")
	qimg, err := need("qemu-img", "qemu-utils", "makes the smoke test's overlay")
	if err != nil {
		return fail(err)
	}
	if err := run(ctx, s.Log, qimg, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", filepath.Join(s.Dir, DiskFile), overlay); err != nil {
		return fail(err)
	}
	emulator, err := need(s.Boot.Emulator, emulatorPackage(s.Boot.Emulator), "boots the smoke test")
	if err != nil {
		return fail(err)
	}
	console := filepath.Join(s.Work, "console.log")
	cfg := virt.DomainConfig{
		Name: s.Name, Accel: s.Accel, Emulator: emulator, Arch: s.Boot.Arch, Machine: s.Boot.Machine,
		CPU: s.Boot.CPU, MemoryMiB: s.Boot.MemoryMiB, VCPUs: s.Boot.VCPUs,
		Kernel: filepath.Join(s.Dir, KernelFile), Initrd: filepath.Join(s.Dir, InitrdFile), Cmdline: s.Boot.Cmdline,
		Disks:      []virt.Disk{{Path: overlay, Format: "qcow2", Bus: s.Boot.DiskBus}},
		ConsoleLog: console,
	}
	if s.Spec.Network.Mode == "static" {
		nc, err := SmokeNetwork(s.Spec.Network)
		if err != nil {
			return fail(err)
		}
		if err := s.H.EnsureNetwork(ctx, nc); err != nil {
			return fail(err)
		}
		cfg.NICs = []virt.NIC{{Bridge: nc.Bridge, MAC: randomMAC(), Model: s.Boot.NetModel}}
	}
	fmt.Fprintf(s.Log, "smoke: starting %s (%s)\n", s.Name, s.Accel)
	start := time.Now()
	if err := s.H.Start(ctx, cfg); err != nil {
		return fail(err)
	}
	defer s.H.Destroy(context.WithoutCancel(ctx), s.Name)
	g := virt.NewGuest(s.H, s.Name, console)
	wctx, cancel := context.WithTimeout(ctx, s.Spec.Smoke.BootTimeout.D())
	defer cancel()
	if err := g.WaitAgent(wctx); err != nil {
		return fail(err)
	}
	res.BootToAgent = records.Duration(time.Since(start).Round(time.Millisecond))
	res.Checks = append(res.Checks, fmt.Sprintf("guest agent answered after %s", res.BootToAgent))
	fmt.Fprintf(s.Log, "smoke: %s\n", res.Checks[len(res.Checks)-1])
	ifs, err := g.Interfaces(ctx)
	if err != nil {
		return fail(err)
	}
	if err := checkNetwork(s.Spec.Network, ifs); err != nil {
		return fail(err)
	}
	res.Checks = append(res.Checks, "network: "+describeNetwork(s.Spec.Network))
	for _, c := range s.Spec.Smoke.Commands {
		r, err := g.Run(ctx, c.Argv...)
		if err != nil {
			return fail(err)
		}
		out := strings.TrimSpace(string(r.Stdout))
		if r.ExitCode != 0 {
			return fail(fmt.Errorf("smoke command %q exited %d: %s", strings.Join(c.Argv, " "), r.ExitCode, strings.TrimSpace(string(r.Stderr))))
		}
		if c.Expect != "" && !strings.Contains(out, c.Expect) {
			return fail(fmt.Errorf("smoke command %q printed %q, want %q", strings.Join(c.Argv, " "), out, c.Expect))
		}
		res.Checks = append(res.Checks, fmt.Sprintf("%s: %s", strings.Join(c.Argv, " "), out))
	}
	res.Passed = true
	return res, nil
}

func describeNetwork(n NetworkSpec) string {
	if n.Mode == "none" {
		return "no interface configured"
	}
	return fmt.Sprintf("%s has %s", n.Interface, n.Address)
}

// checkNetwork compares the agent's view of the interfaces with the spec.
func checkNetwork(n NetworkSpec, ifs []guestagent.Interface) error {
	var seen []string
	for _, i := range ifs {
		seen = append(seen, i.Name+"="+strings.Join(i.Addresses, ","))
		if n.Mode == "none" && i.Name != "lo" {
			for _, a := range i.Addresses {
				if p, err := netip.ParsePrefix(a); err == nil && p.Addr().Is4() {
					return fmt.Errorf("network mode none, but %s has %s", i.Name, a)
				}
			}
		}
		if n.Mode == "static" && i.Name == n.Interface {
			for _, a := range i.Addresses {
				if a == n.Address {
					return nil
				}
			}
		}
	}
	if n.Mode == "none" {
		return nil
	}
	return fmt.Errorf("network: want %s on %s, guest agent reports %s", n.Address, n.Interface, strings.Join(seen, " "))
}

// checkReachable fails early, with a clear message, when libvirt's QEMU
// (an unprivileged user) could not open files under dir because a parent
// directory is not searchable by others.
func checkReachable(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for d := abs; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("libvirt's QEMU runs as an unprivileged user and cannot reach %s: %s is not searchable by others (chmod o+x %s, or use a state directory elsewhere)", abs, d, d)
		}
		if d == "/" {
			return nil
		}
	}
}
