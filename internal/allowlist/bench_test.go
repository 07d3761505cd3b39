package allowlist

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	endpt "github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// benchEntries are n active endpoints of the test lease (public-looking
// addresses that only ever exist as set elements in the benchmark's own
// namespace), from the i-th on.
func benchEntries(from, n int) []*records.AllowEntry {
	es := make([]*records.AllowEntry, n)
	exp := time.Now().Add(24 * time.Hour).Truncate(time.Second)
	for j := range es {
		i := from + j
		a := netip.AddrFrom4([4]byte{45, byte(i >> 16), byte(i >> 8), byte(i)})
		es[j] = &records.AllowEntry{Type: records.AllowEndpoint, Value: netip.AddrPortFrom(a, 443).String() + "/tcp",
			Status: records.StatusActive, Verdict: string(firewall.RateLimit), ExpiresAt: &exp,
			Scope: records.ScopeLease, Lease: testLease, Class: "c2", Score: 1, Reason: "bench"}
	}
	return es
}

// BenchmarkDesired100k reads the live list of a lease whose revision has
// 100,000 active entries from the store, as tb-allow apply does in a
// process that did not write it (apply's own part; bench/tb-allow
// measures the whole path against nft).
func BenchmarkDesired100k(b *testing.B) {
	ctx := context.Background()
	st, _ := state.Open(ctx, b.TempDir())
	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	if _, _, err := (&Book{St: st}).Write(ctx, Commit{Chain: c, Cause: "bench"}, nil, nil, benchEntries(0, 100000)); err != nil {
		b.Fatal(err)
	}
	bk := &Book{St: st}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := bk.Desired(ctx, testLease, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// benchFirewall is a lab firewall with the test lease's rules in a
// network namespace the benchmark creates (lo as the uplink).
func benchFirewall(b testing.TB, maxElements int) *firewall.NFT {
	b.Helper()
	var r [3]byte
	rand.Read(r[:])
	ns := "tbal" + hex.EncodeToString(r[:])
	if err := netns.Create(ns); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { netns.Delete(ns) })
	h, err := vnetns.GetFromPath(netns.Path(ns))
	if err != nil {
		b.Fatal(err)
	}
	nh, err := netlink.NewHandleAt(h)
	h.Close()
	if err != nil {
		b.Fatal(err)
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err == nil {
		err = nh.LinkSetUp(lo)
	}
	if err != nil {
		b.Fatal(err)
	}
	fw, err := firewall.New(firewall.Config{Table: "talkbox_bench", NetNS: netns.Path(ns), Bridge: "tbb-br",
		LabNet: netip.MustParsePrefix("10.13.37.0/24"), Gateway: netip.MustParseAddr("10.13.37.1"),
		SinkIface: "tbb-sink", SinkNet: netip.MustParsePrefix("10.13.38.0/24"), Sinkhole: netip.MustParseAddr("10.13.38.2"),
		Uplink: "lo", MaxElements: uint32(maxElements)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := fw.Up(ctx); err != nil {
		b.Fatal(err)
	}
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: testLease, IP: netip.MustParseAddr("10.13.37.10")}); err != nil {
		b.Fatal(err)
	}
	return fw
}

// benchRevisions writes the test lease's chain, one revision per content,
// and returns their refs.
func benchRevisions(b testing.TB, bk *Book, contents ...[]*records.AllowEntry) []*revRef {
	b.Helper()
	ctx := context.Background()
	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	var refs []*revRef
	for _, es := range contents {
		head, cur, err := bk.Head(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		r, _, err := bk.Write(ctx, Commit{Chain: c, Cause: "bench"}, head, cur, es)
		if err != nil {
			b.Fatal(err)
		}
		ref, err := bk.refOf(ctx, r, nil)
		if err != nil {
			b.Fatal(err)
		}
		refs = append(refs, ref)
	}
	return refs
}

// benchSize is the entries of the benchmarks' big lists.
const benchSize = 100000

// benchLab is a firewall with room for two big lists and a Book on a
// fresh state.
func benchLab(b *testing.B) (*firewall.NFT, *Book) {
	fw := benchFirewall(b, 2*benchSize+16)
	st, err := state.Open(context.Background(), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	return fw, &Book{St: st}
}

// BenchmarkUpdate100k is the promote path of a 100,000-entry revision onto
// an empty live set: from the stored revisions to nftables.
func BenchmarkUpdate100k(b *testing.B) {
	ctx := context.Background()
	const n = benchSize
	fw, bk := benchLab(b)
	refs := benchRevisions(b, bk, []*records.AllowEntry{}, benchEntries(0, n))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		all, err := fw.AllowSet(ctx, testLease)
		if err != nil {
			b.Fatal(err)
		}
		if len(all) > 0 {
			if err := fw.ApplyAllowSet(ctx, testLease, nil, all); err != nil {
				b.Fatal(err)
			}
		}
		if err := bk.writeApplied(testLease, refs[:1], time.Now(), refs[0].Endpoints); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := bk.Update(ctx, fw, testLease)
		if err != nil || res.Added != n {
			b.Fatalf("%+v %v", res, err)
		}
	}
}

// BenchmarkUpdateOne is the promote path of a one-entry change to a
// 100,000-entry list: from the stored revisions to nftables.
func BenchmarkUpdateOne(b *testing.B) {
	ctx := context.Background()
	const n = benchSize
	fw, bk := benchLab(b)
	refs := benchRevisions(b, bk, benchEntries(0, n), benchEntries(0, n+1))
	if _, err := bk.Reconcile(ctx, fw, testLease); err != nil {
		b.Fatal(err)
	}
	x := benchEntries(n, 1)[0]
	ep, _ := endpt.Parse(x.Value)
	a, proto, port := ep.Addr, ep.Proto, ep.Port
	extra := firewall.Element{Dst: a, Proto: proto, Port: port, Verdict: firewall.RateLimit}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := fw.ApplyAllowSet(ctx, testLease, nil, []firewall.Element{extra}); err != nil {
			b.Fatal(err)
		}
		if err := bk.writeApplied(testLease, refs[:1], time.Now(), refs[0].Endpoints); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := bk.Update(ctx, fw, testLease)
		if err != nil || res.Added != 1 || res.Deleted != 0 {
			b.Fatalf("%+v %v", res, err)
		}
	}
}

// BenchmarkPromoteOne is the whole in-process promote path of a one-entry
// change to a 100,000-entry list: the revision written (its blobs, record
// and head) and pushed to nftables by Update, as tb-allow promote does.
func BenchmarkPromoteOne(b *testing.B) {
	ctx := context.Background()
	const n = benchSize
	fw, bk := benchLab(b)
	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	base := benchEntries(0, n)
	head, _, err := bk.Write(ctx, Commit{Chain: c, Cause: "bench"}, nil, nil, base)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := bk.Reconcile(ctx, fw, testLease); err != nil {
		b.Fatal(err)
	}
	cur := base
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// One entry comes, then goes: every revision differs from its head.
		next := append(base[:n:n], benchEntries(n, 1)...)
		if i%2 == 1 {
			next = base
		}
		if head, _, err = bk.Write(ctx, Commit{Chain: c, Cause: "bench"}, head, cur, next); err != nil {
			b.Fatal(err)
		}
		cur = next
		res, err := bk.Update(ctx, fw, testLease)
		if err != nil || res.Added+res.Deleted != 1 {
			b.Fatalf("%+v %v", res, err)
		}
	}
}
