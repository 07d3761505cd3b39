package allowlist

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/blobshare"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// TestChainsAcrossHosts: the allow-list chains are global across a fleet
// whose hosts keep their own blobs. A revision written on host a is read,
// verified and enforced on host b, its blobs fetched from a's worker.
func TestChainsAcrossHosts(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Start(t, pgtest.WithoutFsync()).NewDatabase(t)
	open := func(opts ...state.Option) *state.Store {
		st, err := state.Open(ctx, t.TempDir(), append(opts, state.WithShared(url))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	a := open()
	b := open(state.WithBlobFetcher(blobshare.FromWorkers(blobshare.NewClient(), "b")))
	srv := httptest.NewServer(blobshare.Handler(a))
	t.Cleanup(srv.Close)
	w := &records.Worker{Host: "a", BlobURL: srv.URL, Slots: 1, Heartbeat: a.Now(), DeadAfter: records.Duration(time.Hour)}
	records.Init(w, records.KindWorker, a.Now())
	if err := a.Create(ctx, w); err != nil {
		t.Fatal(err)
	}

	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	expires := time.Now().Add(time.Hour)
	written := writeContent(t, &Book{St: a}, c, []*records.AllowEntry{activeEndpoint(1, firewall.RateLimit, expires)})
	if b.HasBlob(written.ContentSHA256) {
		t.Fatal("the hosts share a blob directory")
	}
	onB := &Book{St: b}
	head, entries, err := onB.Head(c)
	if err != nil || head.ID != written.ID || len(entries) != 1 || entries[0].Value != "45.1.0.1:443/tcp" {
		t.Fatalf("host b reads the chain: %v, %v, %v", head, entries, err)
	}
	if _, err := onB.Verify(c); err != nil {
		t.Fatalf("host b verifies the chain: %v", err)
	}
	live, err := onB.Desired(testLease, time.Now())
	if err != nil || len(live.Elements) != 1 {
		t.Fatalf("host b's enforced set: %+v, %v", live, err)
	}
}
