package virt

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/files"
)

// ProbeConfig is what the acceleration probe boots: a real x86 kernel,
// because on some hosts KVM runs real-mode firmware but hangs as soon as
// the kernel switches modes, so nothing less proves that KVM works.
type ProbeConfig struct {
	Emulator string // qemu-system-x86_64
	Machine  string
	Kernel   string
	// CacheDir holds one result per host (hostname and kernel release).
	CacheDir string
	// Timeout bounds the KVM boot; a working KVM prints the kernel banner
	// in well under a second.
	Timeout time.Duration
}

// ProbeResult is a probe's verdict, cached per host.
type ProbeResult struct {
	Accel  Accel     `json:"accel"`
	Host   string    `json:"host"`
	Kernel string    `json:"kernel"`
	Detail string    `json:"detail"`
	At     time.Time `json:"at"`
}

// GuestCanUseKVM reports whether a guest of this QEMU architecture could
// run under KVM on this host at all.
func GuestCanUseKVM(qemuArch string) bool {
	switch runtime.GOARCH {
	case "amd64":
		return qemuArch == "x86_64" || qemuArch == "i686"
	case "arm64":
		return qemuArch == "aarch64"
	}
	return false
}

func hostKey() (host, release string) {
	host, _ = os.Hostname()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		release = unix.ByteSliceToString(u.Release[:])
	}
	return host, release
}

// ProbeAccel decides between KVM and TCG for guests of the host's
// architecture: it boots cfg.Kernel under KVM in a bare QEMU process and
// accepts KVM only if the kernel's banner reaches the serial port in time.
// The verdict is cached in CacheDir for this host.
func ProbeAccel(ctx context.Context, cfg ProbeConfig) (ProbeResult, error) {
	host, release := hostKey()
	cache := filepath.Join(cfg.CacheDir, "accel-"+host+".json")
	if b, err := os.ReadFile(cache); err == nil {
		var r ProbeResult
		if json.Unmarshal(b, &r) == nil && r.Host == host && r.Kernel == release && (r.Accel == KVM || r.Accel == TCG) {
			return r, nil
		}
	}
	r := ProbeResult{Host: host, Kernel: release, At: time.Now().UTC()}
	r.Accel, r.Detail = probeKVM(ctx, cfg)
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	if err := os.MkdirAll(cfg.CacheDir, 0o755); err != nil {
		return r, err
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	return r, files.WriteAtomic(cache, append(b, '\n'), 0o644)
}

const banner = "Linux version"

func probeKVM(ctx context.Context, cfg ProbeConfig) (Accel, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return TCG, "no usable /dev/kvm: " + err.Error()
	}
	f.Close()
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	machine := cfg.Machine
	if machine == "" {
		machine = "pc"
	}
	cmd := exec.CommandContext(pctx, cfg.Emulator, "-accel", "kvm", "-machine", machine, "-m", "256",
		"-nodefaults", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-kernel", cfg.Kernel, "-append", "console=ttyS0 earlyprintk=serial panic=-1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return TCG, err.Error()
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return TCG, "starting " + cfg.Emulator + ": " + err.Error()
	}
	start := time.Now()
	found := false
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.Contains(sc.Text(), banner) {
			found = true
			break
		}
	}
	cancel()
	cmd.Wait()
	if found {
		return KVM, fmt.Sprintf("kernel banner under KVM after %s", time.Since(start).Round(time.Millisecond))
	}
	if ctx.Err() != nil {
		return TCG, ctx.Err().Error()
	}
	why := fmt.Sprintf("a KVM guest printed no kernel banner within %s", timeout)
	if s := strings.TrimSpace(stderr.String()); s != "" {
		why += " (qemu: " + strings.ReplaceAll(s, "\n", "; ") + ")"
	}
	return TCG, why
}
