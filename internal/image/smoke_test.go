package image

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// agentHV is a hypervisor whose guest agent reports a given address and
// uname output: enough to check what the smoke test demands. Real boots are
// covered by the build test in cmd/tb-build.
type agentHV struct {
	addr, uname string
	started     virt.DomainConfig
	destroyed   bool
}

func (h *agentHV) Start(_ context.Context, c virt.DomainConfig) error { h.started = c; return nil }
func (h *agentHV) Destroy(context.Context, string) error              { h.destroyed = true; return nil }
func (h *agentHV) EnsureNetwork(context.Context, virt.NetworkConfig) error {
	return nil
}
func (h *agentHV) Close() error { return nil }
func (h *agentHV) AgentCommand(_ context.Context, _, cmd string) (string, error) {
	var req struct {
		Execute string `json:"execute"`
	}
	json.Unmarshal([]byte(cmd), &req)
	switch req.Execute {
	case "guest-ping":
		return `{"return":{}}`, nil
	case "guest-network-get-interfaces":
		ip, pfx, _ := strings.Cut(h.addr, "/")
		return fmt.Sprintf(`{"return":[{"name":"eth0","hardware-address":"52:54:00:00:00:01","ip-addresses":[{"ip-address":%q,"prefix":%s}]}]}`, ip, pfx), nil
	case "guest-exec":
		return `{"return":{"pid":1}}`, nil
	case "guest-exec-status":
		return fmt.Sprintf(`{"return":{"exited":true,"exitcode":0,"out-data":%q}}`, base64.StdEncoding.EncodeToString([]byte(h.uname+"\n"))), nil
	}
	return "", fmt.Errorf("unexpected %s", req.Execute)
}

func smokeFixture(t *testing.T, h *agentHV) *Smoke {
	t.Helper()
	ss, _ := LoadSpecs("")
	spec, _ := ss.Get("debian-bookworm-amd64")
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", filepath.Join(dir, DiskFile), "16M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img (qemu-utils): %v %s", err, out)
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&1 == 0 {
			os.Chmod(d, fi.Mode().Perm()|1)
		}
	}
	return &Smoke{H: h, Accel: virt.TCG, Spec: spec, Dir: dir, Work: dir, Name: "tb-smoke-test", Boot: bootFor(spec), Log: io.Discard}
}

func TestSmokeChecksNetworkAndCommands(t *testing.T) {
	h := &agentHV{addr: "10.13.37.10/24", uname: "x86_64"}
	sm := smokeFixture(t, h)
	res, err := sm.Run(context.Background())
	if err != nil || !res.Passed || len(res.Checks) != 3 {
		t.Fatalf("good guest: %+v %v", res, err)
	}
	if !h.destroyed || !strings.HasPrefix(h.started.NICs[0].Bridge, "tbsm-") || !strings.Contains(h.started.Cmdline, "console=ttyS0") {
		t.Fatalf("guest config: %+v destroyed=%v", h.started, h.destroyed)
	}

	for name, bad := range map[string]*agentHV{
		"wrong arch":    {addr: "10.13.37.10/24", uname: "i686"},
		"wrong address": {addr: "10.13.37.99/24", uname: "x86_64"},
	} {
		t.Run(name, func(t *testing.T) {
			res, err := smokeFixture(t, bad).Run(context.Background())
			if err == nil || res.Passed || res.Error == "" {
				t.Fatalf("a bad guest passed: %+v", res)
			}
			if !bad.destroyed {
				t.Fatal("the guest was left running")
			}
		})
	}
}

func TestSmokeNetworkHasNoHostAddress(t *testing.T) {
	n, err := SmokeNetwork(NetworkSpec{Mode: "static", Address: "10.13.37.10/24", Gateway: "10.13.37.1"})
	if err != nil || n.HostCIDR != "" || len(n.Bridge) > 15 || n.Name != "talkbox-smoke-10-13-37-0-24" {
		t.Fatalf("%+v %v", n, err)
	}
}
