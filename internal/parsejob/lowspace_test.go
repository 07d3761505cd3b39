package parsejob

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// smallFS mounts a 128 MiB tmpfs for a state directory (the test runs as
// root, as make test does).
func smallFS(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

func runParse(t *testing.T, root string, req Request) error {
	t.Helper()
	var out, errb bytes.Buffer
	return tbParse(root, strings.NewReader(""), req, &out, &errb)
}

// What a run stopped for low space left: an event, and neither
// observables, nor a flow log, nor a temporary blob.
func checkStoppedCleanly(t *testing.T, root string, err error) {
	t.Helper()
	if !errors.Is(err, diskspace.ErrLow) || fault.Code(err) != fault.ExitTempFail {
		t.Fatalf("err %v (exit %d), want low space and exit 75", err, fault.Code(err))
	}
	st, oerr := state.Open(context.Background(), root)
	if oerr != nil {
		t.Fatal(oerr)
	}
	defer st.Close()
	for kind, want := range map[string]int{records.KindObservable: 0, records.KindArtifact: 0, records.KindEvent: 1} {
		if ids, _ := st.List(kind); len(ids) != want {
			t.Errorf("%d %s records, want %d", len(ids), kind, want)
		}
	}
	if tmp, _ := os.ReadDir(filepath.Join(root, "tmp")); len(tmp) != 0 {
		t.Errorf("temporary files left: %v", tmp)
	}
}

// tb-parse stops before the state's file system fills up: at once when it
// is already low, and in the middle of an input's flow log when the
// margin runs out while it writes.
func TestLowSpaceStopsCleanly(t *testing.T) {
	capture := filepath.Join(t.TempDir(), "scan.pcap")
	scanCapture(t, capture, 40000)
	req := Request{Inputs: []string{capture}, Lease: "lease_01JD0000000000000000000000", Merge: true}

	t.Run("before", func(t *testing.T) {
		root := filepath.Join(smallFS(t), "state")
		req := req
		req.MinFree = diskspace.Threshold{Bytes: 100 << 20}
		checkStoppedCleanly(t, root, runParse(t, root, req))
	})
	t.Run("while writing", func(t *testing.T) {
		root := filepath.Join(smallFS(t), "state")
		if err := os.MkdirAll(root, 0o750); err != nil {
			t.Fatal(err)
		}
		f, err := diskspace.Check(root)
		if err != nil {
			t.Fatal(err)
		}
		// Room to start, not for the whole flow log (about 700 KB).
		req := req
		req.MinFree = diskspace.Threshold{Bytes: f.Avail - minReserve - 64<<10}
		checkStoppedCleanly(t, root, runParse(t, root, req))
		// With room, the same run stores its flow log and observables.
		req.MinFree = diskspace.Threshold{Bytes: 1 << 20}
		if err := runParse(t, root, req); err != nil {
			t.Fatal(err)
		}
	})
}
