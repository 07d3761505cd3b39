package capture_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// BenchmarkLabsContained is what tb-lease adds to every acquire: finding
// the lab of a bridge and checking it is whole and was checked, on a real
// lab (root).
//
//	go test -run XXX -bench LabsContained -benchtime 200x ./internal/capture
func BenchmarkLabsContained(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	lab, err := leasetest.UpLab(ctx, dir, "", "", netip.Prefix{})
	if err != nil {
		b.Fatal(err)
	}
	defer lab.Down()
	st, err := state.Open(ctx, dir)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	labs := capture.Labs{St: st}
	for b.Loop() {
		if err := labs.Contained(ctx, "", lab.Bridge, lab.LabNet); err != nil {
			b.Fatal(err)
		}
	}
}
