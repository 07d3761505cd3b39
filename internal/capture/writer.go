package capture

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"golang.org/x/sys/unix"
)

// File is a finished pcap file.
type File struct {
	Path    string
	SHA256  string
	Size    int64
	Packets uint64
	First   time.Time
	Last    time.Time
	Reason  string
}

// ErrDiskFull is returned by Write when the spool's file system is full;
// the current file has been cut back to its last complete packet.
var ErrDiskFull = errors.New("disk full")

// Writer writes pcap files (nanosecond pcap, Ethernet) in a directory,
// starting a new one by size or age. Packets are buffered and written in
// large chunks of whole records, so a failed write can always be undone
// back to a complete file.
type Writer struct {
	dir, prefix string
	snaplen     int
	maxSize     int64
	every       time.Duration
	now         func() time.Time

	f        *os.File
	path     string
	opened   time.Time
	seq      int
	buf      bytes.Buffer
	pw       *pcapgo.Writer
	hash     hash.Hash
	size     int64 // bytes on disk (complete records)
	packets  uint64
	pending  uint64 // packets in buf
	first    time.Time
	last     time.Time
	firstBuf time.Time
	lastBuf  time.Time
	// ends are the offsets in buf where each buffered record ends, with
	// the timestamps, so that a failed write can keep the records that fit.
	ends []int
	tss  []time.Time
}

const flushAt = 1 << 20

// NewWriter writes files named PREFIX-NNNNN.pcap in dir.
func NewWriter(dir, prefix string, snaplen int, maxSize int64, every time.Duration) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	w := &Writer{dir: dir, prefix: prefix, snaplen: snaplen, maxSize: maxSize, every: every, now: time.Now}
	return w, nil
}

func (w *Writer) open() error {
	w.seq++
	w.path = filepath.Join(w.dir, fmt.Sprintf("%s-%05d.pcap", w.prefix, w.seq))
	f, err := os.OpenFile(w.path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	w.f, w.opened, w.size, w.packets, w.pending = f, w.now(), 0, 0, 0
	w.first, w.last = time.Time{}, time.Time{}
	w.hash = sha256.New()
	w.buf.Reset()
	w.pw = pcapgo.NewWriterNanos(&w.buf)
	if err := w.pw.WriteFileHeader(uint32(w.snaplen), layers.LinkTypeEthernet); err != nil {
		return err
	}
	return w.flush()
}

// Due reports whether the current file should be rotated by age.
func (w *Writer) Due(now time.Time) bool {
	return w.f != nil && w.every > 0 && now.Sub(w.opened) >= w.every
}

// Full reports whether a packet of n bytes would take the current file past
// its size limit (a file with no packet yet takes one of any size).
func (w *Writer) Full(n int) bool {
	return w.f != nil && w.maxSize > 0 && w.size+int64(w.buf.Len())+int64(n)+16 > w.maxSize && w.packets+w.pending > 0
}

// Write appends one packet to the current file, opening one when none is
// open; it never rotates: the caller asks Full and Due first.
func (w *Writer) Write(ts time.Time, data []byte, origLen int) error {
	if w.f == nil {
		if err := w.open(); err != nil {
			return err
		}
	}
	if len(data) > w.snaplen {
		data = data[:w.snaplen]
	}
	ci := gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(data), Length: max(origLen, len(data))}
	if err := w.pw.WritePacket(ci, data); err != nil {
		return err
	}
	w.ends = append(w.ends, w.buf.Len())
	w.tss = append(w.tss, ts)
	if w.pending == 0 {
		w.firstBuf = ts
	}
	w.pending++
	w.lastBuf = ts
	if w.buf.Len() >= flushAt {
		return w.flush()
	}
	return nil
}

// flush writes the buffered records. When the disk fills up, the file
// keeps every record that fitted and is cut back at the last one.
func (w *Writer) flush() error {
	if w.buf.Len() == 0 {
		return nil
	}
	b := w.buf.Bytes()
	_, err := w.f.Write(b)
	if err == nil {
		w.commit(b, w.pending, w.firstBuf, w.lastBuf)
		return nil
	}
	_ = w.f.Truncate(w.size)
	if _, serr := w.f.Seek(w.size, 0); serr != nil {
		err = errors.Join(err, serr)
	}
	// Write record by record: as many as the disk still takes.
	start := 0
	if w.pending == 0 && len(w.ends) == 0 {
		start = len(b) // only the file header was buffered
	}
	for i, end := range w.ends {
		if _, werr := w.f.Write(b[start:end]); werr != nil {
			_ = w.f.Truncate(w.size)
			break
		}
		w.commit(b[start:end], 1, w.tss[i], w.tss[i])
		start = end
	}
	w.buf.Reset()
	w.ends, w.tss = w.ends[:0], w.tss[:0]
	w.pending = 0
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return ErrDiskFull
	}
	return err
}

// commit accounts for bytes written to the file.
func (w *Writer) commit(b []byte, packets uint64, first, last time.Time) {
	w.hash.Write(b)
	w.size += int64(len(b))
	if packets > 0 {
		if w.packets == 0 {
			w.first = first
		}
		w.packets += packets
		w.last = last
	}
	if len(b) == w.buf.Len() {
		w.pending = 0
		w.buf.Reset()
		w.ends, w.tss = w.ends[:0], w.tss[:0]
	}
}

// Rotate closes the current file (even an empty one), hands it to done,
// and lets the next packet open a new one. With no file open it does
// nothing. The file is not synced here: Rotate runs on the packet path,
// and an fsync of a large file can take seconds; whoever done hands the
// file to syncs it.
func (w *Writer) Rotate(reason string, done func(File) error) error {
	if w.f == nil {
		return nil
	}
	ferr := w.flush()
	if err := w.f.Close(); err != nil && ferr == nil {
		ferr = err
	}
	w.f = nil
	if errors.Is(ferr, ErrDiskFull) {
		reason = "disk-full"
	} else if ferr != nil {
		return ferr
	}
	f := File{Path: w.path, SHA256: hex.EncodeToString(w.hash.Sum(nil)), Size: w.size, Packets: w.packets,
		First: w.first, Last: w.last, Reason: reason}
	if done != nil {
		if err := done(f); err != nil {
			return err
		}
	}
	return ferr
}

// Open starts the first file now, so that a capture has a file (and its
// header on disk) before the first packet.
func (w *Writer) Open() error {
	if w.f != nil {
		return nil
	}
	return w.open()
}

// Size is what the open file will hold once its buffer is written, and
// Buffered the part not yet written (0 with no file open).
func (w *Writer) Size() int64 {
	if w.f == nil {
		return 0
	}
	return w.size + int64(w.buf.Len())
}

func (w *Writer) Buffered() int64 {
	if w.f == nil {
		return 0
	}
	return int64(w.buf.Len())
}

// Flush writes buffered packets to the file.
func (w *Writer) Flush() error {
	if w.f == nil {
		return nil
	}
	return w.flush()
}
