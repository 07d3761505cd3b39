package firewall_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func TestValidator(t *testing.T) {
	p := firewall.Policy{SMTPPorts: firewall.DefaultSMTPPorts, Lab: []netip.Prefix{netip.MustParsePrefix("10.13.37.0/24")},
		Host: []netip.Addr{netip.MustParseAddr("93.184.216.1")}}
	refused := map[string]string{
		"10.1.2.3:80/tcp":          "private",
		"172.20.0.1:80/tcp":        "private",
		"192.168.1.1:80/tcp":       "private",
		"127.0.0.1:80/tcp":         "loopback",
		"169.254.169.254:80/tcp":   "link-local",
		"224.0.0.251:5353/udp":     "multicast",
		"255.255.255.255:67/udp":   "broadcast",
		"240.0.0.1:80/tcp":         "reserved",
		"100.64.0.1:80/tcp":        "shared",
		"0.0.0.0:80/tcp":           "this-network",
		"198.51.100.7:443/tcp":     "documentation",
		"93.184.216.1:443/tcp":     "host",
		"8.8.8.8:25/tcp":           "SMTP",
		"8.8.8.8:587/tcp":          "SMTP",
		"8.8.8.8:0/tcp":            "port 0",
		"[2001:4860::8888]:53/udp": "IPv4",
	}
	for in, why := range refused {
		e, err := firewall.ParseElement(in)
		if err == nil {
			err = p.Check(e)
		}
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: got %v, want a refusal mentioning %q", in, err, why)
		}
	}
	for _, ok := range []string{"8.8.8.8:53/udp", "1.1.1.1:443/tcp=rate-limit", "8.8.8.8:25/tcp=drop", "9.9.9.9:80/tcp=redirect", "8.8.8.8:25/tcp=reflect"} {
		e, err := firewall.ParseElement(ok)
		if err != nil || p.Check(e) != nil {
			t.Errorf("%s refused: %v %v", ok, err, p.Check(e))
		}
	}
	p.Documentation = true
	if e, _ := firewall.ParseElement("198.51.100.7:443/tcp"); p.Check(e) != nil {
		t.Error("documentation range refused with Documentation set")
	}
	p.AllowSMTP = true
	if e, _ := firewall.ParseElement("8.8.8.8:25/tcp"); p.Check(e) != nil {
		t.Error("SMTP refused though forced")
	}
	a, _ := firewall.ParseElement("8.8.8.8:80/tcp")
	b, _ := firewall.ParseElement("8.8.8.8:80/tcp=drop")
	if err := p.Plan([]firewall.Element{a, b}, nil); err == nil || !strings.Contains(err.Error(), "conflicting") {
		t.Errorf("conflict not found: %v", err)
	}
	if err := p.Plan([]firewall.Element{a}, []firewall.Element{a}); err == nil {
		t.Error("add and delete of one element accepted")
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]firewall.Rate{
		"64kbytes/second": {Value: 65536, Bytes: true, Per: 1},
		"1 mbytes/minute": {Value: 1 << 20, Bytes: true, Per: 60},
		"100/second":      {Value: 100, Per: 1},
		"":                {},
	} {
		got, err := firewall.ParseRate(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v %v", in, got, err)
		}
	}
	for _, bad := range []string{"fast", "0/second", "10 bits/second", "10/fortnight"} {
		if _, err := firewall.ParseRate(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// fwInNS programs a firewall in a fresh namespace (lo as the uplink).
func fwInNS(t *testing.T, max uint32) *firewall.NFT {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test programs nftables in a namespace: run it as root")
	}
	var b [3]byte
	rand.Read(b[:])
	ns := "tbtf" + hex.EncodeToString(b[:])
	if err := netns.Create(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Delete(ns) })
	f, err := firewall.New(firewall.Config{Table: "talkbox_t", NetNS: netns.Path(ns), Bridge: "tbt-br",
		LabNet: netip.MustParsePrefix("10.13.37.0/24"), Gateway: netip.MustParseAddr("10.13.37.1"),
		SinkIface: "tbt-sink", SinkNet: netip.MustParsePrefix("10.13.38.0/24"), Sinkhole: netip.MustParseAddr("10.13.38.2"),
		Uplink: "tbt-up", Documentation: true, MaxElements: max})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f
}

func elems(n int, base byte, v firewall.Verdict) []firewall.Element {
	out := make([]firewall.Element, n)
	for i := range out {
		out[i] = firewall.Element{Dst: netip.AddrFrom4([4]byte{base, byte(i >> 16), byte(i >> 8), byte(i)}), Proto: "tcp", Port: 443, Verdict: v}
	}
	return out
}

// TestApplyIsAtomic: a batch the kernel refuses (a set would overflow)
// changes nothing; a refused plan is refused before the kernel sees it;
// without an uplink nothing is forwarded.
func TestApplyIsAtomic(t *testing.T) {
	ctx := context.Background()
	f := fwInNS(t, 100)
	lease := records.NewID("lease", time.Now())
	lr := firewall.LeaseRules{Lease: lease, IP: netip.MustParseAddr("10.13.37.10"),
		Elements: elems(3, 9, firewall.Drop)}
	if err := f.ApplyLease(ctx, lr); err != nil {
		t.Fatal(err)
	}
	// Forwarding needs the uplink, which does not exist here.
	err := f.ApplyAllowSet(ctx, lease, elems(1, 8, firewall.Forward), nil)
	var inv *firewall.InvalidError
	if !errors.As(err, &inv) || !strings.Contains(err.Error(), "uplink") {
		t.Fatalf("forward without an uplink: %v", err)
	}
	// Reflect needs the lease's tap, not given here.
	if err := f.ApplyAllowSet(ctx, lease, elems(1, 8, firewall.Reflect), nil); err == nil || !strings.Contains(err.Error(), "tap") {
		t.Fatalf("reflect without a tap: %v", err)
	}
	// 150 redirects overflow a 100-element set: the kernel refuses the
	// whole batch, including the deletion that came with it.
	err = f.ApplyAllowSet(ctx, lease, elems(150, 8, firewall.Redirect), elems(1, 9, firewall.Drop))
	if err == nil {
		t.Fatal("overflowing batch accepted")
	}
	got, err := f.AllowSet(ctx, lease)
	if err != nil || len(got) != 3 || got[0].Verdict != firewall.Drop {
		t.Fatalf("after a refused batch: %v %v", got, err)
	}
	// Moving an element to another verdict is one batch too.
	mv := elems(1, 9, firewall.Redirect)
	if err := f.ApplyAllowSet(ctx, lease, mv, nil); err != nil {
		t.Fatal(err)
	}
	got, _ = f.AllowSet(ctx, lease)
	if len(got) != 3 || got[0].Verdict != firewall.Redirect {
		t.Fatalf("after a move: %v", got)
	}
	// Deleting an absent element and re-adding a present one change nothing.
	if err := f.ApplyAllowSet(ctx, lease, mv, elems(1, 200, firewall.Drop)); err != nil {
		t.Fatalf("absent delete or present add: %v", err)
	}
	if again, _ := f.AllowSet(ctx, lease); len(again) != 3 || again[0] != got[0] {
		t.Fatalf("a no-op change changed the set: %v", again)
	}
	// Another lease cannot take the same guest address.
	other := firewall.LeaseRules{Lease: records.NewID("lease", time.Now()), IP: lr.IP}
	if err := f.ApplyLease(ctx, other); err == nil || !strings.Contains(err.Error(), "already used") {
		t.Fatalf("duplicate lease IP: %v", err)
	}
	if err := f.RemoveLease(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if _, err := f.AllowSet(ctx, lease); !errors.Is(err, firewall.ErrNoLease) {
		t.Fatalf("after removal: %v", err)
	}
	st, err := f.Status(ctx)
	if err != nil || len(st.Leases) != 0 || !st.Up {
		t.Fatalf("status after removal: %+v %v", st, err)
	}
	if err := f.Down(ctx); err != nil {
		t.Fatal(err)
	}
	if up, _ := f.Present(); up {
		t.Fatal("table left after Down")
	}
}

// TestApply10k applies 10,000 allow entries in one batch (the figure in
// docs/performance.md comes from bench/tb-capture).
func TestApply10k(t *testing.T) {
	ctx := context.Background()
	f := fwInNS(t, 0)
	lease := records.NewID("lease", time.Now())
	if err := f.ApplyLease(ctx, firewall.LeaseRules{Lease: lease, IP: netip.MustParseAddr("10.13.37.10")}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := f.ApplyAllowSet(ctx, lease, elems(10000, 8, firewall.Redirect), nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("10,000 elements applied in %s", time.Since(start))
	got, err := f.AllowSet(ctx, lease)
	if err != nil || len(got) != 10000 {
		t.Fatalf("%d elements, %v", len(got), err)
	}
}
