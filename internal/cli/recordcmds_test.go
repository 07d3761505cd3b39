package cli

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// fullWriter fails every write, as a full disk or a pipe whose reader went
// away does.
type fullWriter struct{}

var errFull = errors.New("no space left on device")

func (fullWriter) Write([]byte) (int, error) { return 0, errFull }

// TestRecordCmdsReturnWriteErrors: get and list, which every tool shares,
// return the error of a stdout that takes nothing, so the tool exits
// non-zero instead of 0 with its output lost.
func TestRecordCmdsReturnWriteErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := state.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &records.Sample{SHA256: "aaf9ff488e0767da5ea1d56118e6f65a16c5633b0cefc1fa089bd3ab1810613d", Size: 7}
	records.Init(s, records.KindSample, time.Now())
	if err := st.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	st.Close()
	env := &Env{Ctx: ctx, Tool: "tb-test", Stdout: fullWriter{}, Stderr: io.Discard,
		Log: slog.New(slog.DiscardHandler), G: &Globals{State: dir}}
	if err := (&GetCmd{IDs: []string{s.ID}}).Run(env); !errors.Is(err, errFull) {
		t.Errorf("get onto a full stdout: %v, want its write error", err)
	}
	if err := (&ListCmd{Kind: []string{records.KindSample}}).Run(env); !errors.Is(err, errFull) {
		t.Errorf("list onto a full stdout: %v, want its write error", err)
	}
}
