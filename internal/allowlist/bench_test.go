package allowlist

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// BenchmarkDesired100k reads the live list of a lease whose revision has
// 100,000 active entries (apply's own part; bench/tb-allow measures the
// whole path against nft).
func BenchmarkDesired100k(b *testing.B) {
	ctx := context.Background()
	st, _ := state.Open(ctx, b.TempDir())
	bk := &Book{St: st}
	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	es := make([]*records.AllowEntry, 100000)
	exp := time.Now().Add(time.Hour)
	for i := range es {
		a := netip.AddrFrom4([4]byte{45, byte(i >> 16), byte(i >> 8), byte(i)})
		es[i] = &records.AllowEntry{Type: "endpoint", Value: netip.AddrPortFrom(a, 443).String() + "/tcp", Status: "active", Verdict: "rate-limit", ExpiresAt: &exp, Scope: "lease", Lease: testLease}
	}
	if _, _, err := bk.Write(ctx, Commit{Chain: c, Cause: "bench"}, nil, nil, es); err != nil {
		b.Fatal(err)
	}
	es = nil
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := bk.Desired(testLease, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}
