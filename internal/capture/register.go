package capture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// maxQueued bounds the closed files waiting for the registration goroutine,
// the one being copied included. Registration (a copy into the blob store,
// records in the state, a database in a fleet) runs off the packet path; a
// ring of 64 MiB holds about half a second of full-size packets at 100k/s,
// far less than the copy of a large file takes.
//
// When the queue is full, a size or age rotation is held back: the open file
// grows past --rotate-size (or --rotate-every) until a queued file has been
// registered, and the next packet after that closes it. The packet path
// never waits for room and no file is dropped; a rotate or stop request
// closes its file all the same (they wait for registration themselves, so
// the queue holds at most maxQueued files and theirs). A daemon that dies
// leaves the queued files in its spool, where reconcile registers them
// (reason "recovered").
const maxQueued = 4

// registrationNice is the niceness of the registration goroutine's thread.
const registrationNice = 10

// closedFile is a closed spool file waiting for the registration goroutine:
// its artifact is filled in when it is closed, with the cycle and the
// kernel's drops of that moment.
type closedFile struct {
	file File
	art  *records.Artifact
	// done is closed once the registration goroutine is finished with the
	// file; id is then its artifact ("" when it failed).
	done chan struct{}
	id   string
}

// closeLocked closes the open file and queues it for registration; d.mu is
// held. A file closed at stop or on low space with nothing in it (and no
// drops) is removed instead: it would be an empty artifact. It returns the
// queued file, nil when there is none.
func (d *Daemon) closeLocked(reason string) (*closedFile, error) {
	var cf *closedFile
	err := d.w.Rotate(reason, func(f File) error {
		d.readStatsLocked()
		if f.Packets == 0 && (f.Reason == "stop" || f.Reason == "low-space") && d.drops == 0 && d.fileKeptOut == 0 {
			return os.Remove(f.Path)
		}
		a := &records.Artifact{Cycle: d.rec.Cycle, Lease: d.rec.Lease, Capture: d.ID, Type: TypePcap,
			SHA256: f.SHA256, Size: f.Size, ContentType: "application/vnd.tcpdump.pcap", ParserStatus: "pending",
			Packets: f.Packets, Iface: d.rec.Iface, Filter: d.rec.Filter, Snaplen: d.rec.Snaplen, Drops: d.drops,
			KeptOut: d.fileKeptOut, Forged: d.forged, Reason: f.Reason}
		if f.Packets > 0 {
			first, last := f.First.UTC(), f.Last.UTC()
			a.FirstTS, a.LastTS = &first, &last
		}
		d.drops, d.fileKeptOut, d.forged = 0, 0, 0
		cf = &closedFile{file: f, art: a, done: make(chan struct{})}
		d.queue = append(d.queue, cf)
		d.queuedBytes += f.Size
		select {
		case d.regWake <- struct{}{}:
		default: // the goroutine is already awake
		}
		return nil
	})
	return cf, err
}

// rotateDueLocked closes a file that is full or old and opens the next,
// unless the registration queue is full (maxQueued says why the file then
// grows on); d.mu is held.
func (d *Daemon) rotateDueLocked(reason string) error {
	if len(d.queue) >= maxQueued {
		if !d.heldBack {
			d.heldBack = true
			d.Log.Warn("capture: registration is behind; the open file grows past its rotation until a closed file is registered",
				"capture", d.ID, "queued", len(d.queue), "queued_bytes", d.queuedBytes)
		}
		return nil
	}
	d.heldBack = false
	if _, err := d.closeLocked(reason); err != nil {
		return err
	}
	return d.w.Open()
}

// rotate closes the open file (reopening the next one with reopen) and
// waits until the registration goroutine has registered it and every file
// closed before it. It returns the closed file's artifact ID (none for an
// empty file that was removed) and every registration failure not reported
// yet.
func (d *Daemon) rotate(ctx context.Context, reason string, reopen bool) ([]string, error) {
	d.mu.Lock()
	cf, err := d.closeLocked(reason)
	if err == nil && reopen {
		err = d.w.Open()
	}
	var last *closedFile
	if n := len(d.queue); n > 0 {
		last = d.queue[n-1]
	}
	d.mu.Unlock()
	if last != nil {
		select {
		case <-last.done: // files are registered in order: cf's is done too
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		}
	}
	d.mu.Lock()
	rerr := d.regErr
	d.regErr = nil
	d.mu.Unlock()
	var ids []string
	if cf != nil && cf.id != "" {
		ids = append(ids, cf.id)
	}
	return ids, errors.Join(err, rerr)
}

// registerFiles is the registration goroutine: it registers the queued
// files in the order they were closed until stop is closed and the queue is
// empty. ctx is not cancelled by a stop, so that a stopping capture still
// registers everything it closed.
func (d *Daemon) registerFiles(ctx context.Context, stop <-chan struct{}) {
	for {
		d.mu.Lock()
		var cf *closedFile
		if len(d.queue) > 0 {
			cf = d.queue[0]
		}
		d.mu.Unlock()
		if cf == nil {
			select {
			case <-d.regWake:
				continue
			case <-stop:
				return
			}
		}
		err := d.register(ctx, cf)
		// Dequeued only now: until its copy exists, the low-space guard
		// keeps room for it (reserve).
		d.mu.Lock()
		d.queue = d.queue[1:]
		d.queuedBytes -= cf.file.Size
		if err != nil {
			err = fmt.Errorf("registering %s (left in the spool): %w", cf.file.Path, err)
			d.regErr = errors.Join(d.regErr, err)
		}
		d.mu.Unlock()
		if err != nil {
			d.Log.Error("capture: registration failed", "capture", d.ID, "err", err)
			select {
			case d.regFailed <- struct{}{}:
			default: // Serve's loop is already told
			}
		} else {
			d.kickPrune()
		}
		close(cf.done)
	}
}

// register stores a closed file as a blob and its artifact, for the
// capture's cycle when it was closed, and adds it to the capture record.
func (d *Daemon) register(ctx context.Context, cf *closedFile) error {
	f, a := cf.file, cf.art
	fh, err := os.Open(f.Path)
	if err != nil {
		return err
	}
	defer fh.Close()
	// Durable before it is copied, as it was when the packet path closed
	// it: a crash during the copy leaves reconcile a whole file.
	if err := fh.Sync(); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	records.Init(a, records.KindArtifact, d.St.Now())
	// Held until the record exists, so that a prune of the same content
	// cannot delete the blob in between.
	unlock, err := d.St.LockBlob(ctx, f.SHA256)
	if err != nil {
		return err
	}
	defer unlock()
	blob, err := d.St.PutBlobKnown(ctx, f.SHA256, fh)
	if err != nil {
		// The state's disk is full too: keep the file where it is.
		a.URI = "file://" + f.Path
		a.Metadata = map[string]any{"blob_error": err.Error()}
	} else {
		a.URI = blob.URI()
	}
	if err := d.St.Create(ctx, a); err != nil {
		return err
	}
	cf.id = a.ID
	if a.Metadata == nil {
		// Stored as a blob. A copy left behind costs only its space.
		if err := os.Remove(f.Path); err != nil {
			d.Log.Warn("capture: removing a registered spool file", "capture", d.ID, "file", f.Path, "err", err)
		}
	}
	return d.update(ctx, func(c *records.Capture) {
		c.Artifacts = append(c.Artifacts, a.ID)
		c.Files++
		c.Packets += f.Packets
		c.Drops += a.Drops
		c.KeptOut += a.KeptOut
		c.Forged += a.Forged
	})
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
