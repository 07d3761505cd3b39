package allowlist

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
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
	// hold, when set, makes the blob server take a request and answer
	// nothing until its client hangs up, signalling that it arrived.
	var hold atomic.Pointer[chan struct{}]
	var served atomic.Int64
	blobs := blobshare.Handler(a)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived := hold.Load(); arrived != nil {
			*arrived <- struct{}{}
			<-r.Context().Done()
			return
		}
		served.Add(1)
		blobs.ServeHTTP(w, r)
	}))
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
	head, entries, err := onB.Head(ctx, c)
	if err != nil || head.ID != written.ID || len(entries) != 1 || entries[0].Value != "45.1.0.1:443/tcp" {
		t.Fatalf("host b reads the chain: %v, %v, %v", head, entries, err)
	}
	if _, err := onB.Verify(ctx, c); err != nil {
		t.Fatalf("host b verifies the chain: %v", err)
	}
	live, err := onB.Desired(ctx, testLease, time.Now())
	if err != nil || len(live.Elements) != 1 {
		t.Fatalf("host b's enforced set: %+v, %v", live, err)
	}

	// A read that needs a fetch stops with its context: one cancelled
	// before it asks no blob server at all, one cancelled while a server
	// holds its request returns then (a fleet's Ctrl-C), not when the
	// transfer gives up an hour later.
	second := writeContent(t, &Book{St: a}, c, []*records.AllowEntry{activeEndpoint(1, firewall.RateLimit, expires),
		activeEndpoint(2, firewall.RateLimit, expires)})
	before := served.Load()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := onB.Head(cancelled, c); !errors.Is(err, context.Canceled) {
		t.Errorf("a read under a cancelled context: %v, want context.Canceled", err)
	}
	if n := served.Load() - before; n != 0 || b.HasBlob(second.ContentSHA256) {
		t.Errorf("a read under a cancelled context fetched %d blobs", n)
	}
	arrived := make(chan struct{})
	hold.Store(&arrived)
	inFlight, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := onB.Desired(inFlight, testLease, time.Now())
		done <- err
	}()
	<-arrived
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("a read cancelled while its fetch waits: %v, want context.Canceled", err)
	}
	hold.Store(nil)
	if head, _, err := onB.Head(ctx, c); err != nil || head.ID != second.ID {
		t.Fatalf("host b reads the chain after the cancelled reads: %v, %v", head, err)
	}
}
