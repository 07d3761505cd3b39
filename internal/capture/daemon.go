package capture

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Capture states.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StateStopped  = "stopped"
	StateFailed   = "failed"
)

// SensorRestarts is how often a sensor that dies is restarted before it
// is marked failed.
const SensorRestarts = 3

// request and reply are the control protocol: one JSON line each way.
type request struct {
	Op    string `json:"op"` // rotate, stop, status
	Cycle string `json:"cycle,omitempty"`
}

type reply struct {
	Artifacts []string `json:"artifacts,omitempty"`
	Packets   uint64   `json:"packets"`
	Drops     uint64   `json:"drops"`
	// Unwritten counts packets the kernel accepted that a rotate or stop
	// gave up waiting for (the kernel handed nothing over for a second).
	Unwritten uint64 `json:"unwritten,omitempty"`
	Error     string `json:"error,omitempty"`
}

// Daemon is one running capture: the packet source feeding the rotating
// writer, the sensors, and the control socket.
type Daemon struct {
	St      *state.Store
	ID      string
	Source  Source
	Sensors []Sensor
	Log     *slog.Logger

	// mu guards the packet path's state: the writer, the counters, the
	// registration queue, and reads of rec.
	mu sync.Mutex
	// recMu serialises the updates of the capture record, so that rec is
	// always the newest stored version (an update by the registration
	// goroutine cannot undo a rotate's new cycle); it is taken before mu.
	recMu     sync.Mutex
	rec       records.Capture
	w         *Writer
	drops     uint64 // kernel drops since the last file was closed
	pktsTotal uint64 // packets handed to the writer
	kernPkts  uint64 // packets the kernel accepted (passed the filter), drops included
	kernDrops uint64
	failed    error
	sensorSt  map[string]*records.SensorStatus
	// written is closed and replaced each time a packet is written while a
	// drain waits for it (nil otherwise), so that drain wakes on progress.
	written chan struct{}
	// unwritten counts packets the kernel accepted that a drain gave up
	// waiting for.
	unwritten uint64
	// guards watch the state's file system (and the spool's, when it is
	// another); d.mu is held to use them.
	guards []*diskspace.Guard
	// prune wakes the retention goroutine after a rotation (nil without
	// retention); pruning is done by pruneWG's goroutine.
	prune   chan struct{}
	pruneWG sync.WaitGroup

	// queue holds the closed files the registration goroutine has not
	// finished with, oldest first; queuedBytes is their size, which the
	// state's file system must still take as copies.
	queue       []*closedFile
	queuedBytes int64
	// heldBack is set while a rotation waits for room in the queue.
	heldBack bool
	// regWake wakes the registration goroutine on a new file; regFailed
	// wakes Serve's loop on a failure, which regErr holds until a rotate,
	// a stop or the loop reports it.
	regWake   chan struct{}
	regFailed chan struct{}
	regErr    error
}

// Serve runs the capture until a stop request, ctx's end, or a fatal
// error. A full disk stops it cleanly; so does a file system running low
// (below the capture's min_free), before it is full, with an event and an
// error matching diskspace.ErrLow.
func (d *Daemon) Serve(ctx context.Context) error {
	if err := d.St.Get(d.ID, &d.rec); err != nil {
		return err
	}
	var err error
	if d.guards, err = spaceGuards(d.St, d.rec.Spool, d.threshold()); err != nil {
		return d.fail(ctx, err)
	}
	if err := d.checkSpace(); err != nil {
		return d.fail(ctx, err)
	}
	d.w, err = NewWriter(d.rec.Spool, "capture", d.rec.Snaplen, d.rec.RotateSize, d.rec.RotateEvery.D())
	if err != nil {
		return d.fail(ctx, err)
	}
	if err := d.w.Open(); err != nil {
		return d.fail(ctx, err)
	}
	d.regWake, d.regFailed = make(chan struct{}, 1), make(chan struct{}, 1)
	regStop, regDone := make(chan struct{}), make(chan struct{})
	regCtx := context.WithoutCancel(ctx)
	go func() {
		defer close(regDone)
		d.registerFiles(regCtx, regStop)
	}()
	defer func() {
		close(regStop)
		<-regDone
	}()
	ln, err := listenControl(d.St, d.ID)
	if err != nil {
		return d.fail(ctx, err)
	}
	defer ln.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		d.pruneWG.Wait()
	}()
	d.startRetention(ctx)
	d.startSensors(ctx)
	if err := d.update(ctx, func(c *records.Capture) { c.State, c.PID = StateRunning, os.Getpid() }); err != nil {
		return err
	}

	capErr := make(chan error, 1)
	go func() { capErr <- d.Source.Run(ctx, d.packet) }()
	reqs := make(chan control)
	acceptErr := make(chan error, 1)
	go d.accept(ctx, ln, reqs, acceptErr)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-capErr:
			// The source stopped by itself: a full disk, low space, or an error.
			if ctx.Err() != nil {
				err = nil
			}
			return d.end(ctx, err)
		case err := <-acceptErr:
			return fmt.Errorf("control socket: %w", err)
		case r := <-reqs:
			if stop := d.handle(ctx, r, cancel, capErr); stop {
				return nil
			}
		case <-d.regFailed:
			// A file closed by the packet path (or a time rotation) could
			// not be registered: the capture fails, as the packet path
			// would have when it registered files itself.
			d.mu.Lock()
			err := d.regErr
			d.regErr = nil
			d.mu.Unlock()
			if err != nil {
				cancel()
				<-capErr
				return d.end(ctx, err)
			}
		case <-tick.C:
			d.mu.Lock()
			// Other processes write to the file system too: read it on
			// every tick, not only when this capture has written.
			low := d.checkSpace()
			var err error
			if low == nil && d.w.Due(time.Now()) {
				err = d.rotateDueLocked("time")
			} else if low == nil {
				err = d.w.Flush()
			}
			d.mu.Unlock()
			if err != nil {
				d.Log.Error("capture write", "err", err)
			}
			if low != nil {
				cancel()
				<-capErr
				return d.end(ctx, low)
			}
		case <-ctx.Done():
			// Killed (SIGTERM): finish like a stop request.
			<-capErr
			bg := context.WithoutCancel(ctx)
			_, err := d.rotate(bg, "stop", false)
			d.stopSensors(bg)
			d.collectSensors(bg)
			rerr := d.removeRules(bg)
			return errors.Join(err, rerr, d.update(bg, func(c *records.Capture) {
				c.State = StateStopped
				now := d.St.Now()
				c.StoppedAt = &now
				if c.Rules != nil && rerr == nil {
					c.Rules.Applied = false
				}
			}))
		}
	}
}

func (d *Daemon) packet(ts time.Time, data []byte, origLen int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pktsTotal++
	if d.written != nil {
		close(d.written)
		d.written = nil
	}
	var err error
	if d.w.Full(len(data)) {
		err = d.rotateDueLocked("size")
	} else if d.w.Due(time.Now()) {
		err = d.rotateDueLocked("time")
	}
	if err == nil {
		err = d.w.Write(ts, data, origLen)
	}
	if errors.Is(err, ErrDiskFull) {
		return ErrDiskFull
	}
	if err != nil {
		return err
	}
	// A pcap record is the packet and a 16-byte header.
	return d.wroteLocked(int64(min(len(data), d.rec.Snaplen)) + 16)
}

// end finishes a capture whose source stopped by itself (err nil when it
// was told to stop): the last file is closed and registered, the sensors
// stopped and collected, the lease's rules removed (removeRules), and the
// capture marked stopped, or failed on an error. On low space it stores a capture.low-space event and returns the
// *diskspace.LowError, so that the daemon exits 75.
func (d *Daemon) end(ctx context.Context, err error) error {
	bg := context.WithoutCancel(ctx)
	reason, state := "stop", StateStopped
	var low *diskspace.LowError
	switch {
	case errors.As(err, &low):
		reason = "low-space"
	case errors.Is(err, ErrDiskFull):
		reason = "disk-full"
	case err != nil:
		reason, state = "error", StateFailed
	}
	_, ferr := d.rotate(bg, reason, false)
	d.stopSensors(bg)
	d.collectSensors(bg)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if low != nil {
		msg = "stopped before the disk is full: " + low.Error()
		d.Log.Error("capture stopped: low on disk space", "capture", d.ID, "err", low)
		ferr = errors.Join(ferr, d.event(bg, "capture.low-space", msg))
	}
	rerr := d.removeRules(bg)
	uerr := d.update(bg, func(c *records.Capture) {
		c.State, c.Error = state, msg
		now := d.St.Now()
		c.StoppedAt = &now
		if c.Rules != nil && rerr == nil {
			c.Rules.Applied = false
		}
	})
	if low != nil {
		return errors.Join(fmt.Errorf("capture %s: %w", d.ID, low), ferr, rerr, uerr)
	}
	return errors.Join(ferr, rerr, uerr)
}

// removeRules removes the lease's rules of a capture that ends without a
// stop request (low space, an error, a signal): nothing records the guest's
// traffic any more, so what its plan allowed goes too and the guest keeps
// only the sinkhole, as after "tb-capture stop".
func (d *Daemon) removeRules(ctx context.Context) error {
	d.mu.Lock()
	rec := d.rec
	d.mu.Unlock()
	if err := removeRules(ctx, d.St, &rec); err != nil {
		d.Log.Error("capture ended but its lease's rules stay", "capture", d.ID, "lease", rec.Lease, "err", err)
		return fmt.Errorf("removing the rules of %s: %w", rec.Lease, err)
	}
	return nil
}

// event stores an event about this capture, for its cycle ("tb-run watch"
// shows it with the cycle's).
func (d *Daemon) event(ctx context.Context, typ, detail string) error {
	now := d.St.Now()
	d.mu.Lock()
	cycle := d.rec.Cycle
	d.mu.Unlock()
	e := &records.Event{Type: typ, Subject: d.ID, Cycle: cycle, Detail: detail, At: now}
	records.Init(e, records.KindEvent, now)
	return d.St.Create(ctx, e)
}

func (d *Daemon) threshold() diskspace.Threshold {
	return diskspace.Threshold{Bytes: d.rec.MinFree, Percent: d.rec.MinFreePercent}
}

// checkSpace reads the file systems now and returns a *LowError when one
// is low; d.mu is held (or the capture is not running yet). The state's
// must keep room for the open file's copy into the blob store.
func (d *Daemon) checkSpace() error {
	for i, g := range d.guards {
		if _, err := g.Check(d.reserve(i)); d.lowSpace(err) {
			return err
		}
	}
	return nil
}

// wroteLocked accounts n bytes written to the open file.
func (d *Daemon) wroteLocked(n int64) error {
	for i, g := range d.guards {
		if err := g.Wrote(n, d.reserve(i)); d.lowSpace(err) {
			return err
		}
	}
	return nil
}

// lowSpace reports whether err is low space; a file system that cannot be
// read (statfs failing) does not stop the capture, the writes would tell.
func (d *Daemon) lowSpace(err error) bool {
	if err != nil && !errors.Is(err, diskspace.ErrLow) {
		d.Log.Warn("capture: reading free space", "capture", d.ID, "err", err)
	}
	return errors.Is(err, diskspace.ErrLow)
}

// reserve is what guard i must keep room for besides its threshold: the
// buffer, which is not on disk yet, and, on the state's file system (guard
// 0), a copy of the whole file when it is registered and of each closed
// file still waiting for registration. Guard 1 is the spool's, another file
// system.
func (d *Daemon) reserve(i int) int64 {
	if d.w == nil {
		return 0
	}
	if i == 0 {
		return d.w.Size() + d.w.Buffered() + d.queuedBytes
	}
	return d.w.Buffered()
}

// spaceGuards returns the free-space guards of a capture: the state's file
// system first, then the spool's if it is another.
func spaceGuards(st *state.Store, spool string, min diskspace.Threshold) ([]*diskspace.Guard, error) {
	if min.Zero() {
		return nil, nil
	}
	gs := []*diskspace.Guard{{Path: st.Root(), Min: min}}
	sp := existingDir(spool)
	var a, b unix.Stat_t
	if err := unix.Stat(st.Root(), &a); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", st.Root(), err)
	}
	if err := unix.Stat(sp, &b); err != nil {
		return nil, fmt.Errorf("spool %s: %w", sp, err)
	}
	if a.Dev != b.Dev {
		gs = append(gs, &diskspace.Guard{Path: sp, Min: min})
	}
	return gs, nil
}

// existingDir is dir or its nearest existing parent.
func existingDir(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil || dir == filepath.Dir(dir) {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}

// startRetention starts the goroutine that prunes the lease's pcaps and
// flow logs after each rotation (and once now, which also finishes what a
// crash interrupted), off the packet path.
func (d *Daemon) startRetention(ctx context.Context) {
	ret := Retention{KeepDays: d.rec.KeepDays, KeepBytes: d.rec.KeepBytes}
	if ret.Zero() {
		return
	}
	req := PruneRequest{Lease: d.rec.Lease, Retention: ret}
	if req.Lease == "" {
		req.Capture = d.ID
	}
	d.prune = make(chan struct{}, 1)
	d.prune <- struct{}{}
	d.pruneWG.Add(1)
	go func() {
		defer d.pruneWG.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.prune:
			}
			if _, err := Prune(ctx, d.St, d.Log, req); err != nil && ctx.Err() == nil {
				d.Log.Error("capture retention", "capture", d.ID, "err", err)
			}
		}
	}()
}

// kickPrune asks for a retention pass without waiting for it.
func (d *Daemon) kickPrune() {
	if d.prune == nil {
		return
	}
	select {
	case d.prune <- struct{}{}:
	default: // one is already pending
	}
}

// handle answers one control request, read and checked by serveConn; it
// reports whether the daemon is done.
func (d *Daemon) handle(ctx context.Context, r control, cancel context.CancelFunc, capErr chan error) bool {
	defer r.conn.Close()
	var rep reply
	var err error
	stop := false
	switch req := r.req; {
	case req.Op == "status":
	case req.Op == "rotate":
		if req.Cycle != "" {
			if err := d.update(ctx, func(c *records.Capture) { c.Cycle = req.Cycle }); err != nil {
				rep.Error = err.Error()
				break
			}
		}
		d.drain(ctx)
		rep.Artifacts, err = d.rotate(ctx, "rotate", true)
		if err != nil {
			rep.Error = err.Error()
		}
	case req.Op == "stop":
		// Stop the source first, so that every packet in the ring is
		// written before the last file is closed.
		d.drain(ctx)
		cancel()
		<-capErr
		arts, err := d.rotate(context.WithoutCancel(ctx), "stop", false)
		rep.Artifacts = arts
		d.stopSensors(context.WithoutCancel(ctx))
		rep.Artifacts = append(rep.Artifacts, d.collectSensors(context.WithoutCancel(ctx))...)
		uerr := d.update(context.WithoutCancel(ctx), func(c *records.Capture) {
			c.State = StateStopped
			now := d.St.Now()
			c.StoppedAt = &now
		})
		if err = errors.Join(err, uerr); err != nil {
			rep.Error = err.Error()
		}
		stop = true
	default:
		rep.Error = "unknown op " + req.Op
	}
	d.mu.Lock()
	// Every drop the kernel counted: those of registered files, of queued
	// ones and of the open one.
	rep.Packets, rep.Drops, rep.Unwritten = d.pktsTotal, d.kernDrops, d.unwritten
	d.mu.Unlock()
	writeReply(r.conn, rep)
	return stop
}

// readStatsLocked adds the kernel's counts since the last read (reading
// resets them); d.mu is held.
func (d *Daemon) readStatsLocked() {
	p, dr, err := d.Source.Stats()
	if err != nil {
		return
	}
	d.kernPkts += p
	d.kernDrops += dr
	d.drops += dr
}

// drain waits until every packet the kernel accepted so far has been
// written (TPACKET_V3 hands a block over only when it is full or its
// timeout expires), so that a rotate or stop includes everything sent
// before it. It wakes on each written packet; if the kernel hands nothing
// over for a second, it logs and counts the packets it gave up on.
func (d *Daemon) drain(ctx context.Context) {
	d.mu.Lock()
	d.readStatsLocked()
	want := d.kernPkts - d.kernDrops
	d.mu.Unlock()
	idle := time.NewTimer(time.Second)
	defer idle.Stop()
	for {
		d.mu.Lock()
		got := d.pktsTotal
		if got >= want {
			d.mu.Unlock()
			return
		}
		if d.written == nil {
			d.written = make(chan struct{})
		}
		progress := d.written
		d.mu.Unlock()
		select {
		case <-progress:
			if !idle.Stop() {
				<-idle.C
			}
			idle.Reset(time.Second)
		case <-idle.C:
			d.mu.Lock()
			d.unwritten += want - got
			total := d.unwritten
			d.mu.Unlock()
			d.Log.Warn("capture: gave up waiting for packets the kernel accepted", "capture", d.ID, "missing", want-got, "missing_total", total)
			return
		case <-ctx.Done():
			return
		}
	}
}

// storeBlob stores f's content and returns it with the blob's lock held,
// for the caller to create the record that refers to it before unlocking.
// A prune may delete the content between PutBlob and the lock; it is then
// stored again.
func storeBlob(ctx context.Context, st *state.Store, f io.ReadSeeker) (state.Blob, func(), error) {
	for {
		blob, err := st.PutBlob(ctx, f)
		if err != nil {
			return blob, nil, err
		}
		unlock, err := st.LockBlob(ctx, blob.SHA256)
		if err != nil {
			return blob, nil, err
		}
		if st.HasBlob(blob.SHA256) {
			return blob, unlock, nil
		}
		unlock()
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return blob, nil, err
		}
	}
}

// update changes the capture record; the packet path goes on meanwhile (a
// fleet's store is a database away).
func (d *Daemon) update(ctx context.Context, fn func(*records.Capture)) error {
	d.recMu.Lock()
	defer d.recMu.Unlock()
	var c records.Capture
	err := d.St.Update(ctx, d.ID, &c, func(bool) error {
		fn(&c)
		return nil
	})
	if err == nil {
		d.mu.Lock()
		d.rec = c
		d.mu.Unlock()
	}
	return err
}

func (d *Daemon) fail(ctx context.Context, err error) error {
	d.update(context.WithoutCancel(ctx), func(c *records.Capture) { c.State, c.Error = StateFailed, err.Error() })
	return err
}

// ---- sensors ----

func (d *Daemon) meta(s Sensor) Meta {
	return Meta{Capture: d.ID, Lease: d.rec.Lease, Cycle: d.rec.Cycle, Plan: d.rec.Plan, Iface: d.rec.Iface,
		NetNS: d.rec.NetNS, IP: d.rec.IP, Snaplen: d.rec.Snaplen, Filter: d.rec.Filter,
		Dir: filepath.Join(d.rec.Spool, "sensors", s.Name())}
}

func (d *Daemon) setSensor(ctx context.Context, st records.SensorStatus) {
	d.update(ctx, func(c *records.Capture) {
		for i := range c.Sensors {
			if c.Sensors[i].Name == st.Name {
				c.Sensors[i] = st
				return
			}
		}
		c.Sensors = append(c.Sensors, st)
	})
}

// startSensors starts each sensor with a supervisor that restarts it when
// it dies, up to SensorRestarts times, recording each death.
func (d *Daemon) startSensors(ctx context.Context) {
	for _, s := range d.Sensors {
		st := records.SensorStatus{Name: s.Name(), State: StateRunning}
		if err := s.Prepare(ctx, d.meta(s)); err != nil {
			st.State, st.Error = StateFailed, err.Error()
			d.setSensor(ctx, st)
			continue
		}
		go d.supervise(ctx, s, st)
	}
}

func (d *Daemon) supervise(ctx context.Context, s Sensor, st records.SensorStatus) {
	for {
		pid, exited, err := s.Start(ctx)
		if err != nil {
			st.State, st.Error = StateFailed, err.Error()
			d.setSensor(ctx, st)
			return
		}
		st.PID, st.State = pid, StateRunning
		d.setSensor(ctx, st)
		select {
		case <-ctx.Done():
			return
		case err := <-exited:
			if ctx.Err() != nil {
				return
			}
			st.Error = fmt.Sprintf("exited: %v", err)
			if st.Restarts >= SensorRestarts {
				st.State, st.PID = StateFailed, 0
				d.setSensor(ctx, st)
				d.Log.Error("sensor failed", "sensor", s.Name(), "err", err)
				return
			}
			st.Restarts++
			d.Log.Warn("sensor died; restarting", "sensor", s.Name(), "err", err, "restarts", st.Restarts)
		}
	}
}

func (d *Daemon) stopSensors(ctx context.Context) {
	for _, s := range d.Sensors {
		s.Stop(ctx)
		d.update(ctx, func(c *records.Capture) {
			for i := range c.Sensors {
				if c.Sensors[i].Name == s.Name() && c.Sensors[i].State == StateRunning {
					c.Sensors[i].State, c.Sensors[i].PID = StateStopped, 0
				}
			}
		})
	}
}

// collectSensors registers the sensors' files as artifacts.
func (d *Daemon) collectSensors(ctx context.Context) []string {
	var ids []string
	for _, s := range d.Sensors {
		files, err := s.Collect(ctx)
		if err != nil {
			continue
		}
		for _, p := range files {
			if err := d.roomFor(p); err != nil {
				// Copying it could fill the disk: it stays in the spool.
				d.Log.Error("not registering sensor output", "file", p, "err", err)
				continue
			}
			fh, err := os.Open(p)
			if err != nil {
				continue
			}
			blob, unlock, err := storeBlob(ctx, d.St, fh)
			fh.Close()
			if err != nil {
				d.Log.Error("registering sensor output", "file", p, "err", err)
				continue
			}
			a := &records.Artifact{Cycle: d.rec.Cycle, Lease: d.rec.Lease, Capture: d.ID, Type: "sensor-output",
				Sensor: s.Name(), URI: blob.URI(), SHA256: blob.SHA256, Size: blob.Size, ParserStatus: "pending",
				ContentType: contentType(p), Iface: d.rec.Iface, Metadata: map[string]any{"file": filepath.Base(p)}}
			records.Init(a, records.KindArtifact, d.St.Now())
			err = d.St.Create(ctx, a)
			unlock()
			if err == nil {
				ids = append(ids, a.ID)
				d.update(ctx, func(c *records.Capture) { c.Artifacts = append(c.Artifacts, a.ID) })
			}
		}
	}
	return ids
}

// roomFor checks that the state's file system takes a copy of file p.
func (d *Daemon) roomFor(p string) error {
	if len(d.guards) == 0 {
		return nil
	}
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err = d.guards[0].Check(fi.Size()); d.lowSpace(err) {
		return err
	}
	return nil
}

func contentType(p string) string {
	switch filepath.Ext(p) {
	case ".pcap":
		return "application/vnd.tcpdump.pcap"
	case ".log", ".json":
		return "text/plain"
	}
	return "application/octet-stream"
}

// Call sends one request to a capture's daemon and returns its reply.
func Call(ctx context.Context, st *state.Store, captureID string, op, cycle string) (*reply, error) {
	c, err := dialControl(ctx, st, captureID)
	if err != nil {
		return nil, fmt.Errorf("capture %s is not running: %w (%w)", captureID, errNotRunning, err)
	}
	defer c.Close()
	b, _ := json.Marshal(request{Op: op, Cycle: cycle})
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	line, err := bufio.NewReader(io.LimitReader(c, maxReply)).ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("capture %s: no answer: %w", captureID, err)
	}
	var rep reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return nil, err
	}
	if rep.Error != "" {
		return &rep, errors.New(rep.Error)
	}
	return &rep, nil
}

var errNotRunning = errors.New("no daemon")

// ClockNow reads the wall and monotonic clocks at one instant.
func ClockNow() records.ClockMarker {
	var mono, boot unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono)
	wall := time.Now().UTC()
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot)
	return records.ClockMarker{Wall: wall, MonotonicNS: mono.Nano(), BoottimeNS: boot.Nano()}
}
