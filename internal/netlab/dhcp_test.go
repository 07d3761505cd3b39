package netlab_test

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// TestDHCP: a guest with no address asks the lab's DHCP and gets the fixed
// address its lease was given (busybox udhcpc as the guest's client).
func TestDHCP(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	cfg.DHCP = true
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	g := l.AddGuest("d", netip.MustParseAddr("10.13.37.99")) // its address is removed below
	h := l.Handle(g.NS)
	in, _ := h.LinkByName("eth0")
	addrs, _ := h.AddrList(in, 0)
	for _, a := range addrs {
		h.AddrDel(in, &a)
	}
	want := netip.MustParseAddr("10.13.37.42")
	// Bound to the address DHCP will give it: until then it asks from 0.0.0.0.
	if err := netlab.AttachPort(ctx, cfg, netlab.Port{Name: g.Port, MAC: g.MAC, IP: want}); err != nil {
		t.Fatal(err)
	}
	if err := netlab.SetDHCPHost(cfg.Dir, "lease_TEST", g.MAC.String(), want); err != nil {
		t.Fatal(err)
	}
	var out []byte
	err := netns.Do(netns.Path(g.NS), func() error {
		var err error
		out, err = exec.Command("busybox", "udhcpc", "-i", "eth0", "-f", "-q", "-n", "-t", "5", "-T", "1", "-s", "/bin/true").CombinedOutput()
		return err
	})
	if err != nil || !strings.Contains(string(out), "lease of "+want.String()+" obtained") {
		log, _ := os.ReadFile(filepath.Join(netlab.LogDir(&cfg, "dhcp"), "current"))
		t.Fatalf("udhcpc: %v: %s\ndnsmasq: %s", err, out, log)
	}
}
