package cycle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// fakeGuest is a guest agent in memory. Samples are little programs, one
// instruction per line: "out TEXT", "err TEXT", "exit N", "hang" (run until
// killed), "sleep D" (run for D, then exit 0). An ELF the guest cannot run is "noexec".
type fakeGuest struct {
	mu      sync.Mutex
	files   map[string][]byte
	procs   map[int]*fakeProc
	nextPID int
	spawns  int
	stages  int
	addrs   []string
	pingErr error
	// corrupt flips a byte of every pushed file.
	corrupt bool
	// onSpawn runs after a spawn, before Spawn returns.
	onSpawn func(pid int)
	// onStatus runs on each Status call.
	onStatus func(pid int)
	// stallAfter, when set, makes every "sleep" after that many spawns
	// run until killed.
	stallAfter int
	// silent is how many more Status calls the agent leaves unanswered
	// (Run fails too while it is silent), as a busy TCG guest's does.
	silent int
	// tamper is what a traced sample does to its trace: "kill" its
	// tracer (the trace stops, no end record), "forge" a line of a
	// process no traced one started.
	tamper string
	// noStrace: the guest has no strace, and the launcher says so in the
	// trace.
	noStrace bool
	// survivesKills is how many kills a running sample survives (-1:
	// every one), as one that forks past each kill's walk of its tree;
	// kills counts the kills; failKillsAfter, when set, fails every kill
	// after that many.
	survivesKills, kills, failKillsAfter int
	// clock is the guest's clock's offset from the host's; clockStuck
	// makes setting it fail and leave it as it is; clockSets counts the
	// sets.
	clock      time.Duration
	clockStuck bool
	clockSets  int
}

type fakeProc struct {
	argv    []string
	running bool
	code    int
	signal  int
	killed  bool
	out     string // stdout path
	reaped  bool
	trace   string // the strace trace's path, if traced
	key     string // the end key the launcher read
}

func newFakeGuest() *fakeGuest {
	return &fakeGuest{files: map[string][]byte{}, procs: map[int]*fakeProc{}, nextPID: 100, addrs: []string{"127.0.0.1/8", "10.13.37.10/24"}}
}

func (f *fakeGuest) Ping(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pingErr
}

func (f *fakeGuest) Addresses(ctx context.Context) ([]string, error) { return f.addrs, nil }

func (f *fakeGuest) Clock(ctx context.Context) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().Add(f.clock), nil
}

// SetClock sets the clock and fails, as Debian 12's qemu-ga does without
// hwclock.
func (f *fakeGuest) SetClock(ctx context.Context, t time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clockSets++
	if !f.clockStuck {
		f.clock = time.Until(t)
	}
	return errors.New("guest-set-time: GenericError: hwclock failed to set hardware clock to system time")
}
func (f *fakeGuest) Close() error { return nil }

func (f *fakeGuest) WriteFile(ctx context.Context, path string, r io.Reader) (int64, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.corrupt && len(b) > 0 {
		b[0] ^= 0xff
	}
	f.files[path] = b
	return int64(len(b)), nil
}

func (f *fakeGuest) ReadFileAt(ctx context.Context, path string, off int64, max int) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[path]
	if !ok {
		return nil, fmt.Errorf("guest-file-open %s: No such file or directory", path)
	}
	if off >= int64(len(b)) {
		return nil, nil
	}
	b = b[off:]
	if len(b) > max {
		b = b[:max]
	}
	return append([]byte(nil), b...), nil
}

func (f *fakeGuest) Run(ctx context.Context, argv ...string) (*guestagent.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.silent > 0 {
		return nil, errors.New("guest agent not ready: Guest agent is not responding")
	}
	switch {
	case argv[0] == "/bin/mkdir":
		return &guestagent.Result{}, nil
	case argv[0] == "/usr/bin/test" && argv[1] == "-f":
		if _, ok := f.files[argv[2]]; ok {
			return &guestagent.Result{}, nil
		}
		return &guestagent.Result{ExitCode: 1}, nil
	case argv[0] == "/usr/bin/sha256sum":
		b, ok := f.files[argv[1]]
		if !ok {
			return &guestagent.Result{ExitCode: 1, Stderr: []byte("No such file or directory")}, nil
		}
		f.stages++
		sum := sha256.Sum256(b)
		return &guestagent.Result{Stdout: []byte(hex.EncodeToString(sum[:]) + "  " + argv[1] + "\n")}, nil
	case len(argv) == 5 && strings.Contains(argv[2], "grep -qxF"):
		if b, ok := f.files[argv[4]]; ok {
			return &guestagent.Result{Stdout: b}, nil
		}
		return &guestagent.Result{ExitCode: 3}, nil
	case strings.Contains(strings.Join(argv, " "), "kill -KILL"):
		pid, _ := strconv.Atoi(argv[4])
		f.kills++
		if f.failKillsAfter > 0 && f.kills > f.failKillsAfter {
			return nil, errors.New("guest agent not ready: Guest agent is not responding")
		}
		if f.survivesKills != 0 {
			f.survivesKills--
			return &guestagent.Result{}, nil
		}
		if ev := argv[6] + "/cgroup.events"; f.files[ev] != nil {
			f.files[ev] = []byte("populated 0\nfrozen 1\n")
		}
		if p, ok := f.procs[pid]; ok && p.running {
			p.running, p.killed, p.signal = false, true, 9
			f.ended(pid, p)
		}
		return &guestagent.Result{}, nil
	case strings.Contains(strings.Join(argv, " "), "/proc/$1"):
		pid, _ := strconv.Atoi(argv[len(argv)-1])
		if p, ok := f.procs[pid]; ok && p.running {
			return &guestagent.Result{}, nil
		}
		return &guestagent.Result{ExitCode: 1}, nil
	}
	return nil, fmt.Errorf("fake guest: unexpected command %q", argv)
}

// Spawn runs the launcher: the pidfile, then the sample's program.
func (f *fakeGuest) Spawn(ctx context.Context, argv, env []string, stdin []byte) (int, error) {
	f.mu.Lock()
	if len(argv) < 10 || argv[0] != "/bin/bash" || argv[2] != launcher {
		f.mu.Unlock()
		return 0, fmt.Errorf("fake guest: not the launcher: %q", argv)
	}
	pidfile, out, errp, trace, sample := argv[5], argv[6], argv[7], argv[8], argv[9]
	f.nextPID++
	f.spawns++
	pid := f.nextPID
	p := &fakeProc{argv: argv[9:], out: out, key: strings.TrimSuffix(string(stdin), "\n")}
	f.procs[pid] = p
	f.files[pidfile] = []byte(strconv.Itoa(pid) + "\n")
	f.files[out], f.files[errp] = nil, nil
	if path, ok := strings.CutPrefix(trace, TracerStrace+":"); ok {
		p.trace = path
		f.files[path+".pid"] = []byte(strconv.Itoa(pid+1000) + "\n")
		// The sample runs as the tracer's child: its pid is the next.
		f.files[path] = fmt.Appendf(nil, "%d 1795500967.108906 execve(%q, [%q], 0x7ffc9fab1ca8 /* 3 vars */) = 0\n", pid+1, sample, sample)
		if f.noStrace {
			f.files[path] = []byte(untraced + "\n")
		}
		f.files[fakeDropped] = []byte("#!/bin/sh\nexit 0\n")
		if f.tamper == "forge" {
			f.files[path] = append(f.files[path], "4242 1795500967.2 openat(AT_FDCWD, \"/etc/forged\", O_WRONLY|O_CREAT, 0644) = 3\n"...)
		}
	}
	prog := string(f.files[sample])
	for _, line := range strings.Split(prog, "\n") {
		op, arg, _ := strings.Cut(line, " ")
		switch op {
		case "out":
			f.files[out] = append(f.files[out], arg+"\n"...)
		case "err":
			f.files[errp] = append(f.files[errp], arg+"\n"...)
		case "args":
			f.files[out] = append(f.files[out], strings.Join(argv[10:], " ")+"\n"...)
		case "exit":
			p.code, _ = strconv.Atoi(arg)
		case "hang":
			p.running = true
		case "sleep":
			// Runs for a while, then exits 0.
			d, _ := time.ParseDuration(arg)
			p.running = true
			if f.stallAfter > 0 && f.spawns > f.stallAfter {
				break // this guest's later samples never end
			}
			time.AfterFunc(d, func() {
				f.mu.Lock()
				p.running = false
				f.ended(pid, p)
				f.mu.Unlock()
			})
		case "daemon":
			// Forks a child that goes on in the sample's cgroup after
			// the launcher ends, until killed.
			g := strings.TrimSuffix(pidfile, ".pid")
			f.files[cgroupRoot+"/"+g[strings.LastIndex(g, "/")+1:]+"/cgroup.events"] = []byte("populated 1\nfrozen 0\n")
		case "noexec":
			f.files[errp] = append(f.files[errp], "tb-run: line 17: "+sample+": cannot execute binary file: Exec format error\n"...)
			p.code = 126
		}
	}
	if !p.running {
		f.ended(pid, p)
	}
	hook := f.onSpawn
	f.mu.Unlock()
	if hook != nil {
		hook(pid)
	}
	return pid, nil
}

// ended is what strace and the launcher write when a traced sample ends:
// its exit line, then the end record (a sample that killed its tracer
// leaves neither).
func (f *fakeGuest) ended(pid int, p *fakeProc) {
	if p.trace == "" || f.tamper == "kill" {
		return
	}
	status := p.code
	exit := fmt.Sprintf("exited with %d", p.code)
	if p.signal != 0 {
		status, exit = 128+p.signal, "killed by SIGKILL"
	}
	if !f.noStrace {
		f.files[p.trace] = fmt.Appendf(f.files[p.trace], "%d 1795500967.3 +++ %s +++\n", pid+1, exit)
	}
	f.files[p.trace+".end"] = []byte(fmt.Sprintf("%d %s\n", status, endDigest(p.key, strconv.Itoa(status))))
}

func (f *fakeGuest) Status(ctx context.Context, pid int) (Proc, error) {
	if f.onStatus != nil {
		f.onStatus(pid)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.silent > 0 {
		f.silent--
		return Proc{}, errors.New("guest agent not ready: Guest agent is not responding")
	}
	p, ok := f.procs[pid]
	if !ok || p.reaped {
		return Proc{}, fmt.Errorf("guest-exec-status %d: Invalid parameter 'pid'", pid)
	}
	if p.running {
		return Proc{}, nil
	}
	p.reaped = true // the agent forgets a process once it reported its exit
	return Proc{Exited: true, ExitCode: p.code, Signal: p.signal}, nil
}

// appendOut adds output to a running process's stdout.
func (f *fakeGuest) appendOut(pid int, s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.procs[pid]
	f.files[p.out] = append(f.files[p.out], s...)
}

func (f *fakeGuest) proc(pid int) fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return *f.procs[pid]
}

// fakePost stands for tb-capture, tb-parse and tb-allow: the rotation
// gives a pcap artifact, parsing the observables the beacon leaves, and
// promotion promotes its C2 (once) and refuses its scan.
type fakePost struct {
	st                       *state.Store
	rotates, parses, promote int
	failParse                error
	rev                      *records.AllowRevision
	parsed                   []string // every artifact given to Parse
	dropped                  []string // "PATH=CONTENT" of every file given to PlanDropped
	// traceDropped, when set, are the dropped paths the parsed trace
	// names (by default fakeDropped and a file gone from the guest).
	traceDropped []string
}

func (p *fakePost) EnsureCapture(ctx context.Context, lease string) (string, error) {
	return "capture_01JD0000000000000000000000", nil
}

func (p *fakePost) Rotate(ctx context.Context, lease, cycle string) ([]string, error) {
	p.rotates++
	now := p.st.Now()
	a := &records.Artifact{Cycle: cycle, Lease: lease, Type: "pcap", URI: "blob:sha256:00", Size: 1000, Packets: 10}
	records.Init(a, records.KindArtifact, now)
	return []string{a.ID}, p.st.Create(ctx, a)
}

func (p *fakePost) Dump(ctx context.Context, lease, cycle string) (string, error) {
	a := &records.Artifact{Cycle: cycle, Lease: lease, Type: ArtifactMemoryDump, URI: "blob:sha256:01", Size: 1 << 20}
	records.Init(a, records.KindArtifact, p.st.Now())
	return a.ID, p.st.Create(ctx, a)
}

func (p *fakePost) PlanDropped(ctx context.Context, cycle string, files []DroppedFile) ([]string, error) {
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f.HostPath)
		if err != nil {
			return nil, err
		}
		p.dropped = append(p.dropped, f.GuestPath+"="+string(b))
		out = append(out, records.NewID(records.KindSample, p.st.Now()))
	}
	return out, nil
}

func (p *fakePost) Parse(ctx context.Context, artifacts []string) (int, error) {
	p.parses++
	p.parsed = append(p.parsed, artifacts...)
	if p.failParse != nil {
		err := p.failParse
		p.failParse = nil
		return 0, err
	}
	var a records.Artifact
	if err := p.st.Get(artifacts[0], &a); err != nil {
		return 0, err
	}
	for _, o := range []records.Observable{
		{Type: records.ObsDomain, Value: "c2.example"},
		{Type: records.ObsEndpoint, Value: "203.0.113.5:80/tcp"},
		{Type: records.ObsEndpoint, Value: "192.0.2.10:23/tcp"},
	} {
		o.Lease, o.Cycle, o.Count = a.Lease, a.Cycle, 1
		records.Init(&o, records.KindObservable, p.st.Now())
		if err := p.st.Create(ctx, &o); err != nil {
			return 0, err
		}
	}
	n := 3
	for _, id := range artifacts {
		var t records.Artifact
		if err := p.st.Get(id, &t); err != nil || t.Type != ArtifactTrace {
			continue
		}
		// What tb-parse makes of a trace: the fake guest's sample drops
		// fakeDropped and writes a crontab.
		dropped := p.traceDropped
		if dropped == nil {
			dropped = []string{fakeDropped, "/var/tmp/gone"}
		}
		for _, o := range []records.Observable{
			{Type: records.ObsTrace, Value: "strace", Trace: &records.TraceInfo{Format: "strace", Dropped: dropped}},
			{Type: records.ObsProcess, Value: "101 /var/tmp/sample", Process: &records.ProcessInfo{PID: 101, Exe: "/var/tmp/sample", Names: []string{"kworker/u:tb"},
				Exit: &records.ProcExit{Code: 0}}},
			{Type: records.ObsProcess, Value: "102 /var/tmp/sample", Process: &records.ProcessInfo{PID: 102, PPID: 101, Exe: "/var/tmp/sample"}},
			{Type: records.ObsPath, Value: fakeDropped, Path: &records.PathInfo{Ops: []string{"create", "write", "chmod+x"}, Dropped: true}},
			{Type: records.ObsPersistence, Value: "cron /etc/crontab", Persistence: &records.TechniqueInfo{Technique: "cron"}},
			{Type: records.ObsNetcall, Value: "listen 0.0.0.0:2323/tcp", Netcall: &records.NetcallInfo{Call: "listen", Port: 2323}},
		} {
			o.Lease, o.Cycle, o.Count = t.Lease, t.Cycle, 1
			records.Init(&o, records.KindObservable, p.st.Now())
			if err := p.st.Create(ctx, &o); err != nil {
				return 0, err
			}
			n++
		}
	}
	return n, nil
}

// fakeDropped is the file the fake guest's traced sample drops.
const fakeDropped = "/var/tmp/.tbdrop"

func (p *fakePost) Promote(ctx context.Context, lease, cycle string) (string, error) {
	p.promote++
	if p.rev != nil {
		// Seen again: the entry is refreshed (its status stays).
		rv := *p.rev
		rv.Meta = records.Meta{}
		rv.Seq, rv.Cycle, rv.Previous = p.rev.Seq+1, cycle, p.rev.ID
		rv.Changes = records.Changeset{Changed: []records.Change{{Key: "endpoint 203.0.113.5:80/tcp", From: records.StatusActive, To: records.StatusActive}}}
		records.Init(&rv, records.KindRevision, p.st.Now())
		p.rev = &rv
		return rv.ID, p.st.Create(ctx, &rv)
	}
	rv := &records.AllowRevision{Chain: "lease:" + lease, Lease: lease, Seq: 1, Cycle: cycle, Cause: "promote", Active: 1, Entries: 1,
		EnforceSHA256: "ab", Changes: records.Changeset{Added: []records.Change{{Key: "endpoint 203.0.113.5:80/tcp", To: records.StatusActive}}},
		Refusals: []records.Refusal{{Target: "tcp/23", Class: "scan", Reason: "sweep"}}}
	records.Init(rv, records.KindRevision, p.st.Now())
	p.rev = rv
	return rv.ID, p.st.Create(ctx, rv)
}

type fakeLeaser struct {
	st       *state.Store
	lease    string
	acquired int
}

func (l *fakeLeaser) Acquire(ctx context.Context, plan, holder string, fresh bool) (string, error) {
	if l.lease == "" {
		return "", errors.New("no lease")
	}
	l.acquired++
	return l.lease, nil
}
