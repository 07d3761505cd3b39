package firewall_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	vnetlink "github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
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
		if e, perr := firewall.ParseElement(in); perr == nil {
			if err := p.Plan(append(elems(3, 45, firewall.Forward), e), nil); err == nil || !strings.Contains(err.Error(), why) {
				t.Errorf("%s: a plan with it got %v, want a refusal mentioning %q", in, err, why)
			}
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
	// The namespace's own addresses are never a destination.
	h, err := vnetns.GetFromPath(f.Config().NetNS)
	if err != nil {
		t.Fatal(err)
	}
	nh, err := vnetlink.NewHandleAt(h)
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	lo, err := nh.LinkByName("lo")
	if err == nil {
		err = nh.AddrAdd(lo, &vnetlink.Addr{IPNet: vnetlink.NewIPNet(net.ParseIP("45.9.9.9"))})
	}
	nh.Close()
	if err != nil {
		t.Fatal(err)
	}
	own := firewall.Element{Dst: netip.MustParseAddr("45.9.9.9"), Proto: "tcp", Port: 443, Verdict: firewall.Redirect}
	if err := f.ApplyAllowSet(ctx, lease, []firewall.Element{own}, nil); !errors.As(err, &inv) || !strings.Contains(err.Error(), "address of the host") {
		t.Fatalf("an address of the namespace: %v", err)
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
	// A lease's rules on a lab that is down: the lab is not up, exit 69,
	// which the caller holding the lab words as netlab.NotUpError.
	err = f.ApplyLease(ctx, lr)
	if !errors.Is(err, firewall.ErrTableAbsent) || fault.Code(err) != fault.ExitUnavailable {
		t.Fatalf("rules on a lab that is down: %v (exit %d), want ErrTableAbsent, exit 69", err, fault.Code(err))
	}
}

// TestLargeChange: a change too big to send blind reads the sets, then
// moves, deletes wherever the element is, ignores absent deletions, and
// reads back exactly (the set dump is decoded by hand).
func TestLargeChange(t *testing.T) {
	ctx := context.Background()
	f := fwInNS(t, 0)
	lease := records.NewID("lease", time.Now())
	pinned := elems(3, 9, firewall.Drop)
	if err := f.ApplyLease(ctx, firewall.LeaseRules{Lease: lease, IP: netip.MustParseAddr("10.13.37.10"), Elements: pinned}); err != nil {
		t.Fatal(err)
	}
	add := append(elems(300, 8, firewall.Redirect), firewall.Element{Dst: pinned[0].Dst, Proto: "tcp", Port: 443, Verdict: firewall.Redirect})
	del := []firewall.Element{pinned[1], {Dst: netip.MustParseAddr("45.7.7.7"), Proto: "udp", Port: 53, Verdict: firewall.Forward}}
	del[0].Verdict = firewall.Forward // deleted whatever its verdict
	if err := f.ApplyAllowSet(ctx, lease, add, del); err != nil {
		t.Fatal(err)
	}
	got, err := f.AllowSet(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	want := map[firewall.Element]bool{pinned[2]: true}
	for _, e := range add {
		want[e] = true
	}
	if len(got) != len(want) {
		t.Fatalf("%d elements, want %d", len(got), len(want))
	}
	for _, e := range got {
		if !want[e] {
			t.Fatalf("unexpected element %s", e)
		}
	}
	// Deleting all of them again is one more large change.
	if err := f.ApplyAllowSet(ctx, lease, nil, got); err != nil {
		t.Fatal(err)
	}
	if got, err := f.AllowSet(ctx, lease); err != nil || len(got) != 0 {
		t.Fatalf("after deleting everything: %v %v", got, err)
	}
}

// TestApply10k applies 10,000 allow entries in one batch (the figure in
// docs/performance.md comes from bench/tb-capture), reads them back, and
// changes most of them without reading the set.
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
	for i, e := range elems(10000, 8, firewall.Redirect) {
		if got[i] != e {
			t.Fatalf("element %d is %s, want %s", i, got[i], e)
		}
	}
	// A large change to a set too big to read first: 300 elements move to
	// drop, the rest go, and deleting absent ones changes nothing.
	moved := elems(300, 8, firewall.Drop)
	gone := append(got[300:], elems(50, 7, firewall.Redirect)...)
	if err := f.ApplyAllowSet(ctx, lease, moved, gone); err != nil {
		t.Fatal(err)
	}
	got, err = f.AllowSet(ctx, lease)
	if err != nil || len(got) != 300 {
		t.Fatalf("after the change to the unread set: %d elements, %v", len(got), err)
	}
	for i, e := range moved {
		if got[i] != e {
			t.Fatalf("element %d is %s, want %s", i, got[i], e)
		}
	}
}
