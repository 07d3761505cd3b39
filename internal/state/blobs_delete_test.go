package state_test

import (
	"context"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// TestDeleteBlob: a deleted blob is gone, deleting it again is not an
// error (a prune cut short is redone), and the store can take the same
// content again afterwards.
func TestDeleteBlob(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.PutBlob(ctx, strings.NewReader("pcap"))
	if err != nil {
		t.Fatal(err)
	}
	if sha, ok := state.BlobOf(b.URI()); !ok || sha != b.SHA256 {
		t.Fatalf("BlobOf(%q) = %q, %v", b.URI(), sha, ok)
	}
	for _, bad := range []string{"file:///x", "blob:sha256:", "blob:sha256:" + strings.ToUpper(b.SHA256)} {
		if _, ok := state.BlobOf(bad); ok {
			t.Errorf("BlobOf(%q) accepted", bad)
		}
	}
	unlock, err := st.LockBlob(ctx, b.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteBlob(b.SHA256); err != nil || st.HasBlob(b.SHA256) {
		t.Fatalf("DeleteBlob: %v, still there: %v", err, st.HasBlob(b.SHA256))
	}
	if err := st.DeleteBlob(b.SHA256); err != nil {
		t.Fatalf("deleting again: %v", err)
	}
	unlock()
	if _, err := st.PutBlob(ctx, strings.NewReader("pcap")); err != nil || !st.HasBlob(b.SHA256) {
		t.Fatalf("storing the content again: %v", err)
	}
	if err := st.DeleteBlob("../../x"); err == nil {
		t.Fatal("an invalid digest was accepted")
	}
	if _, err := st.LockBlob(ctx, "x"); err == nil {
		t.Fatal("LockBlob took an invalid digest")
	}
}
