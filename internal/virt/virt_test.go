package virt

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
)

func TestDomainXML(t *testing.T) {
	cfg := DomainConfig{Name: "tb-x", Accel: TCG, Emulator: "/usr/bin/qemu-system-x86_64", Arch: "x86_64", Machine: "q35",
		MemoryMiB: 512, VCPUs: 2, Kernel: "/i/vmlinuz", Initrd: "/i/initrd.img", Cmdline: "root=/dev/vda quiet",
		Disks: []Disk{{Path: "/w/overlay.qcow2"}}, ConsoleLog: "/w/console.log",
		NICs: []NIC{{Bridge: "tbsm-1", MAC: "52:54:00:00:00:01"}}}
	x, err := DomainXML(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var d domainXML
	if err := xml.Unmarshal([]byte(x), &d); err != nil {
		t.Fatalf("not XML: %v\n%s", err, x)
	}
	if d.Type != "qemu" || d.CPU != nil || d.Features == nil || d.Features.ACPI == nil {
		t.Errorf("TCG x86 domain: type %s cpu %+v features %+v", d.Type, d.CPU, d.Features)
	}
	if d.OS.Kernel != "/i/vmlinuz" || d.OS.Initrd != "/i/initrd.img" || d.OS.Cmdline != "root=/dev/vda quiet" || d.OS.Type.Machine != "q35" {
		t.Errorf("os: %+v", d.OS)
	}
	if len(d.Devices.Disks) != 1 || d.Devices.Disks[0].Target.Dev != "vda" || d.Devices.Disks[0].Driver.Type != "qcow2" {
		t.Errorf("disks: %+v", d.Devices.Disks)
	}
	if len(d.Devices.Channels) != 1 || d.Devices.Channels[0].Target.Name != "org.qemu.guest_agent.0" {
		t.Errorf("agent channel: %+v", d.Devices.Channels)
	}
	if len(d.Devices.Interfaces) != 1 || d.Devices.Interfaces[0].Source.Bridge != "tbsm-1" || d.Devices.Interfaces[0].MAC.Address != "52:54:00:00:00:01" {
		t.Errorf("nic: %+v", d.Devices.Interfaces)
	}
	if len(d.Devices.Serials) != 1 || d.Devices.Serials[0].Source.Path != "/w/console.log" {
		t.Errorf("console: %+v", d.Devices.Serials)
	}
	if d.OnCrash != "destroy" || d.OnReboot != "destroy" || d.Memory.Value != 512 || d.VCPU != 2 {
		t.Errorf("lifecycle/limits: %+v", d)
	}

	cfg.Accel, cfg.Arch, cfg.Machine, cfg.CPU = KVM, "x86_64", "pc", "ignored"
	x, _ = DomainXML(cfg)
	if !strings.Contains(x, `type="kvm"`) || !strings.Contains(x, `mode="host-passthrough"`) {
		t.Errorf("KVM domain:\n%s", x)
	}
	cfg.Accel, cfg.Arch, cfg.Machine, cfg.CPU = TCG, "armv7l", "virt", "cortex-a15"
	x, _ = DomainXML(cfg)
	if !strings.Contains(x, "<model>cortex-a15</model>") || strings.Contains(x, "<acpi>") {
		t.Errorf("ARM domain:\n%s", x)
	}
	// A 32-bit ARM kernel without LPAE cannot reach virt's PCIe host
	// bridge: every virtio device must be on virtio-mmio.
	if n := strings.Count(x, `<address type="virtio-mmio"></address>`); n != 3 || strings.Contains(x, `type="pci"`) {
		t.Errorf("ARM domain: %d virtio-mmio devices, want disk, NIC and agent channel's controller:\n%s", n, x)
	}
	nics := cfg.NICs
	cfg.NICs = []NIC{{Bridge: "tbsm-1", Model: "e1000"}}
	if x, _ = DomainXML(cfg); strings.Count(x, `<address type="virtio-mmio"></address>`) != 2 {
		t.Errorf("ARM domain: a non-virtio NIC on virtio-mmio:\n%s", x)
	}
	cfg.NICs = nics
	cfg.Arch, cfg.CPU = "aarch64", "cortex-a57"
	if x, _ = DomainXML(cfg); strings.Contains(x, "<address") {
		t.Errorf("arm64 domain with fixed device addresses:\n%s", x)
	}
	// libvirt's CPU driver has no MIPS: the model must reach QEMU some
	// other way, or libvirt refuses the domain.
	cfg.Arch, cfg.Machine, cfg.CPU = "mips64el", "malta", "5KEf"
	x, _ = DomainXML(cfg)
	if strings.Contains(x, "<cpu") || !strings.Contains(x, `xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0"`) ||
		!strings.Contains(x, `<qemu:arg value="-cpu"></qemu:arg>`) || !strings.Contains(x, `<qemu:arg value="5KEf"></qemu:arg>`) {
		t.Errorf("MIPS domain:\n%s", x)
	}
	cfg.Arch, cfg.CPU = "mipsel", ""
	x, _ = DomainXML(cfg)
	if strings.Contains(x, "<cpu") || strings.Contains(x, "qemu:") {
		t.Errorf("MIPS domain with QEMU's default CPU:\n%s", x)
	}
	if _, err := DomainXML(DomainConfig{Name: "x"}); err == nil {
		t.Error("a domain without a kernel was accepted")
	}
	if _, err := DomainXML(DomainConfig{Name: "x", Kernel: "k", Arch: "x86_64", NICs: []NIC{{}}}); err == nil {
		t.Error("a NIC without network or bridge was accepted")
	}
}

// fakeHV is a hypervisor whose guest agent answers pings after a while;
// the protocol itself is internal/guestagent's, tested there.
type fakeHV struct {
	mu      sync.Mutex
	readyAt int // pings before the agent answers
	pings   int
	gone    bool
}

func (f *fakeHV) Start(context.Context, DomainConfig) error          { return nil }
func (f *fakeHV) Destroy(context.Context, string) error              { return nil }
func (f *fakeHV) EnsureNetwork(context.Context, NetworkConfig) error { return nil }
func (f *fakeHV) Close() error                                       { return nil }

func (f *fakeHV) AgentCommand(ctx context.Context, name, cmd string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cmd != `{"execute":"guest-ping"}` {
		return "", fmt.Errorf("unexpected command %s", cmd)
	}
	if f.gone {
		return "", fmt.Errorf("%s: %w", name, guestagent.ErrGone)
	}
	f.pings++
	if f.pings <= f.readyAt {
		return "", guestagent.ErrNotReady
	}
	return `{"return":{}}`, nil
}

func TestWaitAgent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := &fakeHV{readyAt: 2}
	if err := NewGuest(h, "g", "").WaitAgent(ctx); err != nil || h.pings != 3 {
		t.Fatalf("%v after %d pings", err, h.pings)
	}
}

func TestWaitAgentGivesUpWithConsole(t *testing.T) {
	log := filepath.Join(t.TempDir(), "console.log")
	os.WriteFile(log, []byte("line1\r\nKernel panic - not syncing: VFS\r\n"), 0o644)
	g := NewGuest(&fakeHV{readyAt: 1 << 30}, "g", log)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := g.WaitAgent(ctx)
	var be *BootError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "Kernel panic") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	// A guest that died is reported at once, not at the deadline.
	g = NewGuest(&fakeHV{gone: true}, "g", log)
	start := time.Now()
	err = g.WaitAgent(context.Background())
	if !errors.As(err, &be) || !errors.Is(err, guestagent.ErrGone) || time.Since(start) > 5*time.Second {
		t.Fatalf("dead guest: %v after %s", err, time.Since(start))
	}
}

func TestConnectFailureSaysHowToStart(t *testing.T) {
	_, err := Connect("qemu+unix:///system?socket=/nonexistent/libvirt-sock")
	if fault.Code(err) != fault.ExitUnavailable || !strings.Contains(err.Error(), "libvirtd -d") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("got %v (exit %d)", err, fault.Code(err))
	}
}

func TestConnectAndBridge(t *testing.T) {
	h, err := Connect("")
	if err != nil {
		t.Fatalf("libvirtd must run for the tests (scripts/deps.sh starts it): %v", err)
	}
	defer h.Close()
	// Destroying a guest that does not exist is not an error.
	if err := h.Destroy(context.Background(), "tb-test-no-such-guest"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.AgentCommand(context.Background(), "tb-test-no-such-guest", `{"execute":"guest-ping"}`); !errors.Is(err, guestagent.ErrGone) {
		t.Fatalf("agent of a missing guest: %v", err)
	}
	n := NetworkConfig{Name: "tb-test", Bridge: "tbtest0"}
	t.Cleanup(func() { exec.Command("ip", "link", "del", "tbtest0").Run() })
	if err := h.EnsureNetwork(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if err := h.EnsureNetwork(context.Background(), n); err != nil {
		t.Fatalf("second EnsureNetwork: %v", err)
	}
	if _, err := os.Stat("/sys/class/net/tbtest0/bridge"); err != nil {
		t.Fatalf("tbtest0 is not a bridge: %v", err)
	}
	if b, _ := os.ReadFile("/sys/class/net/tbtest0/operstate"); len(b) == 0 {
		t.Fatal("no operstate")
	}
	if err := h.EnsureNetwork(context.Background(), NetworkConfig{Name: "x", Bridge: "much-too-long-bridge-name"}); err == nil {
		t.Fatal("an over-long bridge name was accepted")
	}
}

func TestProbeAccelIsCached(t *testing.T) {
	dir := t.TempDir()
	// A kernel that does not exist never prints a banner: the probe must
	// settle on TCG, whatever /dev/kvm says.
	cfg := ProbeConfig{Emulator: "qemu-system-x86_64", Kernel: filepath.Join(dir, "missing-vmlinuz"), CacheDir: dir, Timeout: 5 * time.Second}
	r1, err := ProbeAccel(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Accel != TCG || r1.Detail == "" {
		t.Fatalf("probe: %+v", r1)
	}
	r2, err := ProbeAccel(context.Background(), cfg)
	if err != nil || !r2.At.Equal(r1.At) {
		t.Fatalf("second probe was not served from the cache: %+v %v", r2, err)
	}
	if !GuestCanUseKVM("x86_64") || GuestCanUseKVM("mipsel") {
		t.Fatal("GuestCanUseKVM")
	}
}

func TestMaltaDevicesGetRoutedSlots(t *testing.T) {
	x, err := DomainXML(DomainConfig{Name: "m", Arch: "mipsel", Machine: "malta", Kernel: "k",
		Disks: []Disk{{Path: "d"}}, NICs: []NIC{{Bridge: "b"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, slot := range []string{`slot="0x12"`, `slot="0x13"`, `slot="0x14"`} {
		if !strings.Contains(x, slot) {
			t.Errorf("no device in %s (Malta routes interrupts to slots 18-21 only):\n%s", slot, x)
		}
	}
	if x, _ := DomainXML(DomainConfig{Name: "x", Arch: "x86_64", Machine: "q35", Kernel: "k", Disks: []Disk{{Path: "d"}}}); strings.Contains(x, "<address") {
		t.Errorf("q35 devices should be placed by libvirt:\n%s", x)
	}
}
