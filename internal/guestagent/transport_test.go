//go:build cgo

package guestagent_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// TestTransportsAgree puts both transports, libvirt's library and virsh,
// before the domains whose agent cannot answer, under the real libvirtd: a
// domain that does not exist and one that is defined but shut off are
// ErrGone, a running one whose agent never connected (no guest system at
// all: it sits in the firmware) is ErrNotReady. A real agent's answers are
// covered by the VM tests (cycle.TestRealGuest drives both transports).
func TestTransportsAgree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lv, err := virt.Connect(virt.DefaultURI)
	if err != nil {
		t.Fatalf("libvirtd must run for the tests (scripts/deps.sh starts it): %v", err)
	}
	defer lv.Close()
	vs, err := guestagent.NewVirsh(virt.DefaultURI)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("tb-guestagent-%08x", rand.Uint32())
	off, on := name+"-off", name+"-on"
	domain := func(name string) string {
		return `<domain type="qemu"><name>` + name + `</name><memory unit="MiB">32</memory><os><type arch="x86_64">hvm</type></os>` +
			`<devices><channel type="unix"><target type="virtio" name="org.qemu.guest_agent.0"/></channel></devices></domain>`
	}
	virsh := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", virt.DefaultURI}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("virsh %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	dir := t.TempDir()
	for _, d := range []string{off, on} {
		if err := os.WriteFile(filepath.Join(dir, d+".xml"), []byte(domain(d)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	virsh("define", filepath.Join(dir, off+".xml"))
	t.Cleanup(func() { exec.Command("virsh", "-q", "-c", virt.DefaultURI, "undefine", off).Run() })
	virsh("create", filepath.Join(dir, on+".xml"))
	t.Cleanup(func() { exec.Command("virsh", "-q", "-c", virt.DefaultURI, "destroy", on).Run() })

	for tname, tr := range map[string]guestagent.Transport{"libvirt": lv, "virsh": vs} {
		for _, c := range []struct {
			domain string
			want   error
		}{{name + "-missing", guestagent.ErrGone}, {off, guestagent.ErrGone}, {on, guestagent.ErrNotReady}} {
			err := guestagent.New(tr, c.domain).Ping(ctx)
			if !errors.Is(err, c.want) || !strings.HasPrefix(err.Error(), "guest-ping: ") {
				t.Errorf("%s, %s: %v, want %v", tname, c.domain, err, c.want)
			}
		}
	}
	// Waiting is cut short by a cancelled ctx, virsh's process too.
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := guestagent.New(vs, on).Wait(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("virsh, waiting for an agent that never comes: %v", err)
	}
}
