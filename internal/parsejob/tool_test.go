package parsejob

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// tbParse does what "tb-parse" does with req in the state directory root:
// stdin read from in, records printed to out, warnings to errb.
func tbParse(root string, in io.Reader, req Request, out, errb io.Writer) error {
	ctx := context.Background()
	sink := cmdout.New("tb-parse", out, errb, nil)
	job, err := Prepare(req, in, sink.Warnf)
	if err != nil {
		return err
	}
	var st *state.Store
	if job.NeedsState() {
		if st, err = state.Open(ctx, root, state.WithDurability(state.SyncOnFlush)); err != nil {
			return err
		}
		defer st.Close()
	}
	return job.Run(ctx, st, sink)
}

// tbFlows does what "tb-parse flows" does in the state directory root.
func tbFlows(root string, req FlowsRequest, out, errb io.Writer) error {
	ctx := context.Background()
	st, err := state.Open(ctx, root)
	if err != nil {
		return err
	}
	defer st.Close()
	return Flows(ctx, st, req, cmdout.New("tb-parse", out, errb, nil))
}

// TestInputBytes: what tb-parse primes its heap by counts files and the
// blobs the state holds, not a blob it would have to fetch.
func TestInputBytes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "a.pcap")
	if err := os.WriteFile(file, make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := state.Open(ctx, filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	blob, err := st.PutBlob(ctx, strings.NewReader(strings.Repeat("x", 3000)))
	if err != nil {
		t.Fatal(err)
	}
	stdin := `{"kind":"artifact","id":"artifact_01JD0000000000000000000001","sha256":"` + blob.SHA256 + `"}` + "\n" +
		`{"kind":"artifact","id":"artifact_01JD0000000000000000000002","sha256":"` + strings.Repeat("0", 64) + `"}` + "\n"
	job, err := Prepare(Request{Inputs: []string{file}, FromStdin: true}, strings.NewReader(stdin), t.Errorf)
	if err != nil {
		t.Fatal(err)
	}
	if got := job.InputBytes(st); got != 4000 {
		t.Errorf("with the state: %d bytes, want 4000", got)
	}
	if got := job.InputBytes(nil); got != 1000 {
		t.Errorf("without the state: %d bytes, want 1000", got)
	}
}
