package capture

import (
	"context"
	"errors"
	"time"
)

func (d *Daemon) packet(ts time.Time, data []byte, origLen int, outgoing bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.written != nil {
		close(d.written)
		d.written = nil
	}
	if !outgoing && d.bound != nil && !d.bound.Passes(data, d.rec.Bound.DHCP) {
		// From the guest, and dropped by the bridge: it reached nothing.
		d.fileKeptOut++
		if d.bound.Forged(data) {
			d.forged++
		}
		d.keptOut++
		return nil
	}
	d.pktsTotal++
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
		got := d.pktsTotal + d.keptOut
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
