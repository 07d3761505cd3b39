package capture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
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
	recMu sync.Mutex
	rec   records.Capture
	w     *Writer
	drops uint64 // kernel drops since the last file was closed
	// bound is the lease's port binding (rec.Bound): frames from the
	// guest it does not pass are counted in fileKeptOut (since the last
	// file was closed; forged, those of them that claimed another
	// identity) and keptOut (in all, for drain), and not written.
	bound                        *firewall.PortBinding
	fileKeptOut, forged, keptOut uint64
	pktsTotal                    uint64 // packets handed to the writer
	kernPkts                     uint64 // packets the kernel accepted (passed the filter), drops included
	kernDrops                    uint64
	failed                       error
	sensorSt                     map[string]*records.SensorStatus
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
	if b := d.rec.Bound; b != nil {
		if d.bound, err = portBinding(b); err != nil {
			return d.fail(ctx, err)
		}
	}
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
		// The copy into the blob store (a read, a sha256 and a write of
		// each file) competes with the packet path for the CPU: on a busy
		// host the packet path must win, or the ring overflows while a
		// large file is copied. Niceness is a thread's; the thread is not
		// unlocked, so it ends with this goroutine.
		runtime.LockOSThread()
		if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), registrationNice); err != nil {
			d.Log.Warn("capture: registration at the packet path's priority", "capture", d.ID, "err", err)
		}
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

// ClockNow reads the wall and monotonic clocks at one instant.
func ClockNow() records.ClockMarker {
	var mono, boot unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono)
	wall := time.Now().UTC()
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot)
	return records.ClockMarker{Wall: wall, MonotonicNS: mono.Nano(), BoottimeNS: boot.Nano()}
}
