// Package image builds, smoke-tests, signs and publishes Talkbox guest
// images from declarative specs, and manages their lifecycle (verify, pin,
// supersede, rollback, rm, gc).
package image

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/platform"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

//go:embed specs/*.json
var embedded embed.FS

// Spec is a declarative image: what to install and how the image boots.
// Fields left out of a spec file take the defaults of its architecture.
type Spec struct {
	ID          string `json:"id"`
	Version     string `json:"version"`
	Description string `json:"description,omitempty"`
	// Arch is the Debian architecture.
	Arch      string        `json:"arch"`
	OS        OSSpec        `json:"os"`
	Packages  []string      `json:"packages"`
	Kernel    KernelSpec    `json:"kernel"`
	Boot      BootSpec      `json:"boot"`
	Disk      DiskSpec      `json:"disk"`
	Network   NetworkSpec   `json:"network"`
	VM        VMSpec        `json:"vm"`
	Hardening HardeningSpec `json:"hardening"`
	Smoke     SmokeSpec     `json:"smoke"`

	// Source is where the spec was read from ("embedded" or a path).
	Source string `json:"source,omitempty"`
}

// OSSpec is the distribution release and where its packages come from.
type OSSpec struct {
	Distribution string   `json:"distribution"`
	Release      string   `json:"release"`
	Mirror       string   `json:"mirror"`
	Components   []string `json:"components"`
	// Variant is mmdebstrap's package set (essential, minbase, …).
	Variant string `json:"variant"`
}

// KernelSpec names the kernel package and the modules the initramfs loads
// before it mounts the root disk (missing or built-in ones are skipped).
type KernelSpec struct {
	Package string   `json:"package"`
	Modules []string `json:"modules"`
}

// BootSpec is how the guest boots: talkbox-init (a shell script, then
// busybox init running the guest agent; seconds under TCG) or systemd.
type BootSpec struct {
	Mode    string `json:"mode"`
	Console string `json:"console"`
	Cmdline string `json:"cmdline"`
}

// DiskSpec sizes the root filesystem.
type DiskSpec struct {
	SizeMiB int `json:"size_mib"`
}

// NetworkSpec is the guest's network set-up. Static addresses can be
// overridden per boot on the kernel command line (talkbox.ip=, talkbox.gw=).
type NetworkSpec struct {
	Mode      string   `json:"mode"` // static or none
	Interface string   `json:"interface"`
	Address   string   `json:"address,omitempty"` // CIDR
	Gateway   string   `json:"gateway,omitempty"`
	DNS       []string `json:"dns,omitempty"`
}

// VMSpec is the virtual machine the image boots in.
type VMSpec struct {
	Emulator  string `json:"emulator"`
	QEMUArch  string `json:"qemu_arch"`
	Machine   string `json:"machine"`
	CPU       string `json:"cpu,omitempty"`
	MemoryMiB int    `json:"memory_mib"`
	VCPUs     int    `json:"vcpus"`
	DiskBus   string `json:"disk_bus"`
	NetModel  string `json:"net_model"`
}

// HardeningSpec removes and locks what a sandbox guest should not have.
type HardeningSpec struct {
	LockRoot bool   `json:"lock_root"`
	Hostname string `json:"hostname"`
	// Exclude are dpkg path-exclude globs: never unpacked.
	Exclude []string          `json:"exclude,omitempty"`
	Sysctl  map[string]string `json:"sysctl,omitempty"`
}

// SmokeSpec is what must work before an image is published.
type SmokeSpec struct {
	BootTimeout records.Duration `json:"boot_timeout"`
	Commands    []SmokeCommand   `json:"commands"`
}

// SmokeCommand runs in the guest through the agent; it must exit 0 and its
// output must contain Expect.
type SmokeCommand struct {
	Argv   []string `json:"argv"`
	Expect string   `json:"expect,omitempty"`
}

// archDefaults are what a Debian architecture needs to boot under QEMU.
type archDefaults struct {
	kernel, console, qemuArch, cpu, bus string
	extraModules                        []string
	// cmdline replaces defaultCmdline where the board limits its length.
	cmdline string
	// abi is the userland ABI a dynamic sample of the architecture must
	// match, named as internal/triage names records.ABI.Name; empty where
	// the architecture has only one.
	abi string
}

var arches = map[string]archDefaults{
	"amd64": {kernel: "linux-image-amd64", console: "ttyS0", qemuArch: "x86_64"},
	"i386":  {kernel: "linux-image-686-pae", console: "ttyS0", qemuArch: "i686"},
	"arm64": {kernel: "linux-image-arm64", console: "ttyAMA0", qemuArch: "aarch64", cpu: "cortex-a57", extraModules: []string{"virtio_mmio"}},
	"armhf": {kernel: "linux-image-armmp", console: "ttyAMA0", qemuArch: "armv7l", cpu: "cortex-a15", extraModules: []string{"virtio_mmio"}, abi: "eabi5-hf"},
	// 32-bit ARM guests reach their disk over virtio-mmio (internal/virt).
	// Debian armel has no kernel for QEMU's virt board; the armhf one runs
	// an EABI soft-float userland as well (multiarch, see foreignArches).
	"armel":  {kernel: "linux-image-armmp:armhf", console: "ttyAMA0", qemuArch: "armv7l", cpu: "cortex-a15", extraModules: []string{"virtio_mmio"}, abi: "eabi5-sf"},
	"mipsel": {kernel: "linux-image-4kc-malta", console: "ttyS0", qemuArch: "mipsel", cmdline: maltaCmdline, abi: "o32"},
	// QEMU's Malta default for mips64el is the 20Kc, a MIPS64 release 1
	// CPU; Debian's mips64el userland needs release 2, and a CPU with an
	// FPU spares the kernel emulating every floating-point instruction.
	// libvirt has no MIPS CPU driver: internal/virt hands QEMU the model.
	"mips64el": {kernel: "linux-image-5kc-malta", console: "ttyS0", qemuArch: "mips64el", cpu: "5KEf", cmdline: maltaCmdline, abi: "n64"},
	"ppc64el":  {kernel: "linux-image-powerpc64le", console: "hvc0", qemuArch: "ppc64le", cpu: "POWER9", abi: "elfv2"},
	"s390x":    {kernel: "linux-image-s390x", console: "ttysclp0", qemuArch: "s390x", extraModules: []string{"virtio_ccw"}},
}

// Required packages: the guest agent always; busybox-static gives the
// initramfs and talkbox-init their shell and tools.
// defaultCmdline keeps the console quiet (every character is slow under
// TCG) and skips boot work a throw-away sandbox guest does not need.
const defaultCmdline = "quiet loglevel=3 mitigations=off rodata=off tsc=reliable no_timer_check cryptomgr.notests audit=0 apparmor=0 random.trust_cpu=on"

// maltaCmdline is what defaultCmdline does that matters on Malta, short
// enough to fit maltaCmdlineMax with a lease's parameters, and the timer
// parameters QEMU's Malta board needs. Left out: x86-only options (tsc=,
// no_timer_check, random.trust_cpu), rodata= (MIPS has no strict kernel
// RWX), cryptomgr.notests (Debian's kernels skip the self-tests already),
// mitigations=off (nothing to turn off on these CPUs), quiet (loglevel=3
// after it set the console's level anyway) and apparmor=0 (for room).
//
// nohz=off highres=off: a periodic tick (HZ 250 in Debian's Malta
// kernels; the 4kc one has no tickless mode, the 5kc one has), so that
// CP0 Compare is written only by the timer interrupt's handler. Under
// QEMU 7.2 a Malta guest whose kernel reprograms Compare between ticks
// (for each high-resolution timer, and on entering tickless idle) lost
// its timer interrupt now and then and got none for 20 to 40 seconds,
// its sleeps with it: the demo's mipsel guest took 101-258 s where it
// takes 46-61 s with these (docs/performance.md). A likely cause, from
// a reading of QEMU's cp0_timer.c not checked further: its vCPU thread
// writes Compare and re-arms the host timer without the lock its main
// loop fires that timer under, and a firing that reads the old Compare
// re-arms it a whole Count wrap (2^32 ticks, 43 s at 100 MHz) ahead and
// raises an interrupt the guest's own write then lowers. The cost: a
// sample's sleeps end on a tick (4 ms).
const maltaCmdline = "loglevel=3 audit=0 nohz=off highres=off"

// maltaCmdlineMax is the longest command line QEMU's Malta board hands the
// kernel (hw/mips/malta.c: ENVP_ENTRY_SIZE 256, NUL included); it drops
// the rest without a word. With an initrd, QEMU writes its address and
// size into the same 256 bytes first (maltaInitrdArgs at their widest).
const maltaCmdlineMax = 255

const maltaInitrdArgs = "rd_start=0xffffffff80000000 rd_size=2147483647 "

var requiredPackages = []string{"qemu-guest-agent", "busybox-static"}

var baseModules = []string{"virtio_pci", "virtio_blk", "virtio_net", "virtio_console", "crc32c_generic", "crc32c_intel", "ext4"}

var specID = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,63}$`)
var semver = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// Resolve fills defaults and checks the spec. Errors name the field.
func (s *Spec) Resolve() error {
	if !specID.MatchString(s.ID) {
		return fmt.Errorf("id %q: want lower-case letters, digits, '.' and '-'", s.ID)
	}
	if s.Version == "" {
		s.Version = "1.0.0"
	}
	if !semver.MatchString(s.Version) {
		return fmt.Errorf("%s: version %q is not MAJOR.MINOR.PATCH", s.ID, s.Version)
	}
	p, ok := platform.Lookup(s.Arch)
	ad, ok2 := arches[s.Arch]
	if !ok || !ok2 || !p.Images {
		return &UnsupportedArchError{Spec: s.ID, Arch: s.Arch}
	}
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&s.OS.Distribution, "debian")
	def(&s.OS.Release, "bookworm")
	def(&s.OS.Mirror, "http://deb.debian.org/debian")
	def(&s.OS.Variant, "essential")
	if len(s.OS.Components) == 0 {
		s.OS.Components = []string{"main"}
	}
	if s.OS.Distribution != "debian" {
		return fmt.Errorf("%s: os.distribution %q: only debian is supported", s.ID, s.OS.Distribution)
	}
	def(&s.Kernel.Package, ad.kernel)
	if len(s.Kernel.Modules) == 0 {
		s.Kernel.Modules = append(append([]string{}, ad.extraModules...), baseModules...)
	}
	def(&s.Boot.Mode, "talkbox-init")
	def(&s.Boot.Console, ad.console)
	def(&s.Boot.Cmdline, cmp.Or(ad.cmdline, defaultCmdline))
	switch s.Boot.Mode {
	case "talkbox-init":
	case "systemd":
		s.Packages = append(s.Packages, "systemd-sysv", "udev")
	default:
		return fmt.Errorf("%s: boot.mode %q: want talkbox-init or systemd", s.ID, s.Boot.Mode)
	}
	if s.Disk.SizeMiB == 0 {
		s.Disk.SizeMiB = 4096
	}
	if s.Disk.SizeMiB < 256 {
		return fmt.Errorf("%s: disk.size_mib %d is too small (at least 256)", s.ID, s.Disk.SizeMiB)
	}
	def(&s.Network.Mode, "static")
	def(&s.Network.Interface, "eth0")
	switch s.Network.Mode {
	case "static":
		def(&s.Network.Address, "10.13.37.10/24")
		def(&s.Network.Gateway, "10.13.37.1")
		pfx, err := netip.ParsePrefix(s.Network.Address)
		if err != nil || !pfx.Addr().Is4() {
			return fmt.Errorf("%s: network.address %q: want an IPv4 CIDR like 10.13.37.10/24", s.ID, s.Network.Address)
		}
		gw, err := netip.ParseAddr(s.Network.Gateway)
		if err != nil || !pfx.Masked().Contains(gw) || gw == pfx.Addr() {
			return fmt.Errorf("%s: network.gateway %q: want another address in %s", s.ID, s.Network.Gateway, pfx.Masked())
		}
		if len(s.Network.DNS) == 0 {
			s.Network.DNS = []string{s.Network.Gateway}
		}
	case "none":
	default:
		return fmt.Errorf("%s: network.mode %q: want static or none", s.ID, s.Network.Mode)
	}
	def(&s.VM.Emulator, p.QEMU)
	def(&s.VM.QEMUArch, ad.qemuArch)
	def(&s.VM.Machine, p.Machine)
	def(&s.VM.CPU, ad.cpu)
	def(&s.VM.DiskBus, "virtio")
	def(&s.VM.NetModel, "virtio")
	if s.VM.MemoryMiB == 0 {
		s.VM.MemoryMiB = 512
	}
	if s.VM.VCPUs == 0 {
		s.VM.VCPUs = 1
	}
	def(&s.Hardening.Hostname, "sandbox")
	if s.Smoke.BootTimeout == 0 {
		s.Smoke.BootTimeout = records.Duration(180e9)
	}
	if len(s.Smoke.Commands) == 0 {
		s.Smoke.Commands = []SmokeCommand{{Argv: []string{"uname", "-m"}, Expect: UnameMachine(s.Arch)}}
	}
	pk := append(append([]string{}, requiredPackages...), s.Kernel.Package)
	s.Packages = dedupe(append(pk, s.Packages...))
	if s.VM.Machine == "malta" {
		if n := len(MaltaCmdline(bootFor(s).Cmdline, s.Network.Interface)); n > maltaCmdlineMax {
			return fmt.Errorf("%s: boot.cmdline is too long for QEMU's Malta board: with the image's own parameters, a lease's and QEMU's initrd address it is %d bytes, and Malta passes the kernel at most %d (shorten boot.cmdline by %d bytes)",
				s.ID, n, maltaCmdlineMax, n-maltaCmdlineMax)
		}
	}
	return nil
}

// LeaseCmdline is what a lease (internal/lease) puts ahead of its image's
// command line: the guest's interface, address, gateway and resolver (the
// lab's gateway, whose DNS the lab redirects to the sinkhole).
func LeaseCmdline(iface, ip string, prefix int, gw string) string {
	return fmt.Sprintf("talkbox.net=static talkbox.if=%s talkbox.ip=%s/%d talkbox.gw=%s talkbox.dns=%s", iface, ip, prefix, gw, gw)
}

// MaltaCmdline is, at its longest, what a Malta guest's kernel is handed
// for an image command line: QEMU's initrd arguments, then a lease's
// parameters (which internal/lease puts first), then the image's own.
func MaltaCmdline(image, iface string) string {
	const widest = "255.255.255.255"
	return maltaInitrdArgs + LeaseCmdline(iface, widest, 32, widest) + " " + image
}

// ABI is the userland ABI of an image of a Debian architecture, as
// records.SandboxImage.ABI and internal/triage name it.
func ABI(arch string) string { return arches[arch].abi }

// foreignArches are the other Debian architectures a spec installs
// packages of ("pkg:arch"), such as armel's armhf kernel.
func (s *Spec) foreignArches() []string {
	var out []string
	for _, p := range s.Packages {
		if _, a, ok := strings.Cut(p, ":"); ok && a != s.Arch && a != "all" && a != "any" && a != "native" {
			out = append(out, a)
		}
	}
	return dedupe(out)
}

// UnameMachine is what uname -m prints in a guest of a Debian architecture.
func UnameMachine(arch string) string {
	return map[string]string{"amd64": "x86_64", "i386": "i686", "arm64": "aarch64", "armhf": "armv7l",
		"armel": "armv7l", "mipsel": "mips", "mips64el": "mips64", "ppc64el": "ppc64le", "s390x": "s390x"}[arch]
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range in {
		p = strings.TrimSpace(p)
		if p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// UnsupportedArchError is a spec for an architecture with no image support.
type UnsupportedArchError struct{ Spec, Arch string }

func (e *UnsupportedArchError) Error() string {
	var names []string
	for a := range arches {
		names = append(names, a)
	}
	sort.Strings(names)
	why := ""
	if p, ok := platform.Lookup(e.Arch); ok && p.Why != "" {
		why = " (" + p.Why + ")"
	}
	return fmt.Sprintf("%s: unsupported architecture %q%s; supported: %s", e.Spec, e.Arch, why, strings.Join(names, ", "))
}

// SHA256 is the digest of the resolved spec, recorded with every build.
func (s *Spec) SHA256() string {
	c := *s
	c.Source = ""
	b, _ := json.Marshal(c)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Specs are the specs known to this build: embedded ones, then a user
// directory's, which replace embedded ones of the same id.
type Specs struct {
	byID  map[string]*Spec
	order []string
}

// LoadSpecs reads the embedded specs and those in dir (which may be absent).
// A malformed user spec is an error naming its file.
func LoadSpecs(dir string) (*Specs, error) {
	ss := &Specs{byID: map[string]*Spec{}}
	files, _ := fs.Glob(embedded, "specs/*.json")
	for _, f := range files {
		b, _ := embedded.ReadFile(f)
		if err := ss.add(b, "embedded"); err != nil {
			return nil, fmt.Errorf("embedded %s: %w", f, err)
		}
	}
	if dir != "" {
		paths, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		sort.Strings(paths)
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, err
			}
			if err := ss.add(b, p); err != nil {
				return nil, fault.DataErr(fmt.Errorf("%s: %w", p, err))
			}
		}
	}
	sort.Strings(ss.order)
	return ss, nil
}

func (ss *Specs) add(b []byte, source string) error {
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return err
	}
	s.Source = source
	if _, ok := ss.byID[s.ID]; !ok {
		ss.order = append(ss.order, s.ID)
	}
	ss.byID[s.ID] = &s
	return nil
}

// IDs lists the spec ids in order.
func (ss *Specs) IDs() []string { return ss.order }

// Get returns a resolved copy of a spec. An unknown id or an unsupported
// architecture exits 69 naming what is available.
func (ss *Specs) Get(id string) (*Spec, error) {
	raw, ok := ss.byID[id]
	if !ok {
		return nil, fault.Unavailable(fmt.Errorf("unknown spec %q (known: %s; see 'tb-build specs')", id, strings.Join(ss.order, ", ")))
	}
	b, _ := json.Marshal(raw)
	var s Spec
	json.Unmarshal(b, &s)
	if err := s.Resolve(); err != nil {
		var ua *UnsupportedArchError
		if errors.As(err, &ua) {
			return nil, fault.Unavailable(err)
		}
		return nil, fault.DataErr(fmt.Errorf("spec %s (%s): %w", id, raw.Source, err))
	}
	return &s, nil
}

// Version is an image version: the spec's semantic version and a build
// number, written "1.0.0+build.3".
type Version struct {
	Spec  string
	Build int
}

func (v Version) String() string { return v.Spec + "+build." + strconv.Itoa(v.Build) }

// ParseVersion reads "1.0.0+build.3".
func ParseVersion(s string) (Version, error) {
	sv, b, ok := strings.Cut(s, "+build.")
	n, err := strconv.Atoi(b)
	if !ok || err != nil || n < 1 || !semver.MatchString(sv) {
		return Version{}, fmt.Errorf("version %q: want MAJOR.MINOR.PATCH+build.N", s)
	}
	return Version{Spec: sv, Build: n}, nil
}

// Less orders versions by semantic version, then build number.
func (v Version) Less(o Version) bool {
	a, b := semParts(v.Spec), semParts(o.Spec)
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return v.Build < o.Build
}

func semParts(s string) [3]int {
	var out [3]int
	for i, p := range strings.SplitN(s, ".", 3) {
		out[i], _ = strconv.Atoi(p)
	}
	return out
}
