package cycle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Tools runs the other tb-* binaries: tb-lease for leasing, tb-capture,
// tb-parse and tb-allow for post-processing. Records go to a tool as JSON
// lines, as in a shell pipeline, and the IDs a tool prints of the few
// records it made are taken from its output, except promote's revision,
// which is found in the state by the cycle key on revisions; what a tool
// stores in bulk (tb-parse's observables) is read from the state, by key.
type Tools struct {
	// Dir holds the binaries (default: tb-run's own directory, then $PATH).
	Dir string
	St  *state.Store
	Log *slog.Logger
	// Lab is the lab instance of tb-capture and tb-allow.
	Lab string
	// Host, when set, pins new leases to that tb-lease host (a fleet
	// worker's own).
	Host string
}

func (t *Tools) path(name string) (string, error) {
	if t.Dir != "" {
		p := filepath.Join(t.Dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return exec.LookPath(name)
}

// run runs one tool with stdin and returns its records.
func (t *Tools) run(ctx context.Context, stdin io.Reader, name string, args ...string) ([]records.Record, error) {
	out, err := t.output(ctx, stdin, name, args...)
	if err != nil {
		return nil, err
	}
	// Only records are taken; a line that is not one is passed over.
	var recs []records.Record
	rd := records.NewReader(bytes.NewReader(out), name)
	for {
		l, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return recs, nil
		}
		if err != nil {
			return nil, err
		}
		rec, err := records.Decode(l.Data)
		if err != nil {
			t.Log.Debug("not a record", "tool", name, "line", l.No, "err", err)
			continue
		}
		recs = append(recs, rec)
	}
}

// output runs one tool with stdin and returns its stdout.
func (t *Tools) output(ctx context.Context, stdin io.Reader, name string, args ...string) ([]byte, error) {
	var out bytes.Buffer
	if err := t.exec(ctx, stdin, &out, name, args...); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// exec runs one tool with stdin, its stdout going to stdout (nil: to
// /dev/null, for a tool whose output tb-run does not need).
func (t *Tools) exec(ctx context.Context, stdin io.Reader, stdout io.Writer, name string, args ...string) error {
	p, err := t.path(name)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	// The records this process wrote must be on disk for the tool to
	// read them: the page cache is shared, so they are.
	cmd := exec.CommandContext(ctx, p, append(t.St.Flags(), args...)...)
	cmd.Env = append(os.Environ(), t.St.Environ()...)
	if t.Host != "" {
		// tb-lease names its default host after the fleet host.
		cmd.Env = append(cmd.Env, "TB_HOST="+t.Host)
	}
	cmd.Stdin = stdin
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &errb
	t.Log.Debug("running", "cmd", name+" "+strings.Join(args, " "))
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, msg)
	}
	return nil
}

func ids(recs []records.Record, kind string) []string {
	var out []string
	for _, r := range recs {
		if r.Header().Kind == kind {
			out = append(out, r.Header().ID)
		}
	}
	return out
}

// Acquire is "tb-lease acquire --plan P --holder H [--fresh]".
func (t *Tools) Acquire(ctx context.Context, plan, holder string, fresh bool) (string, error) {
	args := []string{"acquire", "--plan", plan, "--holder", holder}
	if t.Host != "" {
		args = append(args, "--host", t.Host)
	}
	if fresh {
		args = append(args, "--fresh")
	}
	recs, err := t.run(ctx, nil, "tb-lease", args...)
	if err != nil {
		return "", err
	}
	l := ids(recs, records.KindLease)
	if len(l) != 1 {
		return "", fmt.Errorf("tb-lease acquire printed %d leases", len(l))
	}
	return l[0], nil
}

// Keep is "tb-lease release --keep L": the lease goes back to the host's
// idle pool, still running, for the next matching acquire.
func (t *Tools) Keep(ctx context.Context, lease string) error {
	return t.exec(ctx, nil, nil, "tb-lease", "release", "--keep", lease)
}

// Capabilities is what "tb-lease inspect host H" says the fleet host can
// lease: the platforms of the images whose files are there, and those of
// them it runs under KVM (a Worker's Capabilities).
func (t *Tools) Capabilities(ctx context.Context) (platforms, native []string, err error) {
	out, err := t.output(ctx, nil, "tb-lease", "inspect", "host", t.Host)
	if err != nil {
		return nil, nil, err
	}
	var r struct {
		Platforms []string `json:"platforms"`
		Native    []string `json:"native"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return nil, nil, fmt.Errorf("tb-lease inspect host %s: %w", t.Host, err)
	}
	return r.Platforms, r.Native, nil
}

// Release is "tb-lease release L": the lease's guest is destroyed.
func (t *Tools) Release(ctx context.Context, lease string) error {
	return t.exec(ctx, nil, nil, "tb-lease", "release", lease)
}

// EnsureCapture returns the lease's running capture (read from the state),
// starting one with "tb-capture start --lease L" if there is none, and
// makes the live allow set what the lease's, sample's and global chains
// enforce ("tb-allow apply --lease L": nothing is sent when it already
// is). A capture starts with an empty set, so without this a cycle after
// a restarted capture would record as in force a revision that is not.
func (t *Tools) EnsureCapture(ctx context.Context, lease string) (string, error) {
	id, err := t.capture(ctx, lease)
	if err != nil {
		return "", err
	}
	if err := t.exec(ctx, nil, nil, "tb-allow", "apply", "--lab", t.lab(), "--lease", lease); err != nil {
		return "", fmt.Errorf("applying the allow-list: %w", err)
	}
	return id, nil
}

func (t *Tools) capture(ctx context.Context, lease string) (string, error) {
	running, err := state.LatestBy(t.St, records.KindCapture, records.KeyLease, lease, func(c *records.Capture) bool {
		return c.State == "running" || c.State == "starting"
	})
	if err == nil {
		return running.ID, nil
	}
	if !errors.Is(err, state.ErrNotFound) {
		return "", err
	}
	recs, err := t.run(ctx, nil, "tb-capture", "start", "--lab", t.lab(), "--lease", lease)
	if err != nil {
		return "", err
	}
	c := ids(recs, records.KindCapture)
	if len(c) == 0 {
		return "", errors.New("tb-capture start printed no capture")
	}
	t.Log.Info("capture started", "lease", lease, "capture", c[0])
	return c[0], nil
}

func (t *Tools) lab() string {
	if t.Lab == "" {
		return "default"
	}
	return t.Lab
}

// Dump is "tb-lease dump L --cycle C".
func (t *Tools) Dump(ctx context.Context, lease, cycle string) (string, error) {
	recs, err := t.run(ctx, nil, "tb-lease", "dump", lease, "--cycle", cycle)
	if err != nil {
		return "", err
	}
	a := ids(recs, records.KindArtifact)
	if len(a) != 1 {
		return "", fmt.Errorf("tb-lease dump printed %d artifacts", len(a))
	}
	return a[0], nil
}

// PlanDropped is "tb-plan --dropped-by C --dropped-path P FILE" per file.
func (t *Tools) PlanDropped(ctx context.Context, cycle string, files []DroppedFile) ([]string, error) {
	var out []string
	for _, f := range files {
		recs, err := t.run(ctx, nil, "tb-plan", "--dropped-by", cycle, "--dropped-path", f.GuestPath, f.HostPath)
		if err != nil {
			return out, err
		}
		out = append(out, ids(recs, records.KindSample)...)
	}
	return out, nil
}

// Rotate is "tb-capture rotate --lease L --cycle C".
func (t *Tools) Rotate(ctx context.Context, lease, cycle string) ([]string, error) {
	recs, err := t.run(ctx, nil, "tb-capture", "rotate", "--lease", lease, "--cycle", cycle)
	if err != nil {
		return nil, err
	}
	return ids(recs, records.KindArtifact), nil
}

// Parse is "tb-parse --merge" over the artifacts' records, as in the pipe
// tb-capture rotate | tb-parse --merge. tb-parse prints every observable
// it merged (a big capture's are hundreds of thousands): tb-run reads none
// of that output, and finds what it stored in the state instead. It
// returns how many observables the artifacts' cycles now hold, counted by
// the cycle key without reading them.
func (t *Tools) Parse(ctx context.Context, artifacts []string) (int, error) {
	var in bytes.Buffer
	cycles := map[string]bool{}
	for _, id := range artifacts {
		raw, err := t.St.ReadRaw(id)
		if err != nil {
			return 0, err
		}
		var a records.Artifact
		if err := records.Unmarshal(raw, &a); err != nil {
			return 0, fmt.Errorf("%s: %w", id, err)
		}
		cycles[a.Cycle] = true
		in.Write(bytes.TrimSpace(raw))
		in.WriteByte('\n')
	}
	if err := t.exec(ctx, &in, nil, "tb-parse", "--merge", "-"); err != nil {
		return 0, err
	}
	n := 0
	for c := range cycles {
		if c == "" {
			continue
		}
		found, err := t.St.ByKey(records.KindObservable, records.KeyCycle, c)
		if err != nil {
			return 0, err
		}
		n += len(found)
	}
	return n, nil
}

// Promote is "tb-allow promote --lease L --cycle C", whose output tb-run
// does not read: it returns the revision left in force, found in the
// state. That is the one of the lease's chain stored with the cycle's key
// (the one this promote wrote), else, when nothing changed, the chain's
// head; a cycle without observables promoted nothing ("").
func (t *Tools) Promote(ctx context.Context, lease, cycle string) (string, error) {
	if err := t.exec(ctx, nil, nil, "tb-allow", "promote", "--lab", t.lab(), "--lease", lease, "--cycle", cycle); err != nil {
		return "", err
	}
	chain := "lease:" + lease
	rev, err := state.LatestBy(t.St, records.KindRevision, records.KeyCycle, cycle, func(r *records.AllowRevision) bool {
		return r.Chain == chain
	})
	if err == nil {
		return rev.ID, nil
	}
	if !errors.Is(err, state.ErrNotFound) {
		return "", err
	}
	obs, err := t.St.ByKey(records.KindObservable, records.KeyCycle, cycle)
	if err != nil || len(obs) == 0 {
		return "", err
	}
	head, err := currentRevision(t.St, chain)
	if err != nil || head == nil {
		return "", err
	}
	return head.ID, nil
}
