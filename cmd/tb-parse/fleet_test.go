package main

import (
	"context"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/blobshare"
	"github.com/talkbox-sandbox/talkbox/internal/clitest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// TestFleetScripts runs tb-parse as one host of a fleet: TB_STATE is a
// database of a PostgreSQL cluster the test starts (one database per
// script), TB_LOCAL the host's own directory $WORK/b.
func TestFleetScripts(t *testing.T) {
	pg := pgtest.Start(t, pgtest.WithoutFsync())
	cmds := clitest.Cmds()
	cmds["mkpcap"] = mkpcap
	cmds["expand"] = expand
	cmds["fleethost"] = fleethost
	cmds["deafhost"] = deafhost
	testscript.Run(t, testscript.Params{Dir: "testdata/fleet", Cmds: cmds, Setup: func(env *testscript.Env) error {
		env.Setenv("TB_STATE", pg.NewDatabase(t))
		env.Setenv("TB_LOCAL", filepath.Join(env.WorkDir, "b"))
		return nil
	}})
}

// fleethost HOST [FILE VAR]: another host of the fleet, with its own
// directory $WORK/HOST, whose worker serves that directory's blobs on a
// real listener (tb-run worker --serve-blobs) and is recorded live in the
// shared store; FILE is stored among its blobs and $VAR set to its sha256.
func fleethost(ts *testscript.TestScript, neg bool, args []string) {
	if neg || (len(args) != 1 && len(args) != 3) {
		ts.Fatalf("usage: fleethost HOST [FILE VAR]")
	}
	ctx := context.Background()
	st, err := state.Open(ctx, ts.MkAbs(args[0]), state.WithShared(ts.Getenv("TB_STATE")))
	ts.Check(err)
	srv := httptest.NewServer(blobshare.Handler(st))
	ts.Defer(func() { srv.Close(); st.Close() })
	liveWorker(ts, st, args[0], srv.URL)
	if len(args) == 3 {
		f, err := os.Open(ts.MkAbs(args[1]))
		ts.Check(err)
		defer f.Close()
		b, err := st.PutBlob(ctx, f)
		ts.Check(err)
		ts.Setenv(args[2], b.SHA256)
	}
}

// deafhost HOST: a host of the fleet recorded with a live worker whose
// blob server does not answer (nothing listens on its port).
func deafhost(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: deafhost HOST")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	ts.Check(err)
	url := "http://" + l.Addr().String()
	ts.Check(l.Close())
	st, err := state.Open(context.Background(), ts.MkAbs(args[0]), state.WithShared(ts.Getenv("TB_STATE")))
	ts.Check(err)
	defer st.Close()
	liveWorker(ts, st, args[0], url)
}

func liveWorker(ts *testscript.TestScript, st *state.Store, host, url string) {
	w := &records.Worker{Host: host, Slots: 1, BlobURL: url, Heartbeat: st.Now(), DeadAfter: records.Duration(time.Hour)}
	records.Init(w, records.KindWorker, st.Now())
	ts.Check(st.Create(context.Background(), w))
}
