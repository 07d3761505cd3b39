package triage

import (
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"io/fs"
	"math"
)

// Digests is one pass over the content.
type Digests struct {
	MD5, SHA1, SHA256 string
	Size              int64
	Entropy           float64 // Shannon byte entropy, bits per byte (0..8), 4 decimals
}

// digestChunk is small enough that a chunk fed to all three hashes and the
// byte counter stays in L1/L2 between them.
const digestChunk = 32 << 10

type digester struct {
	md5, sha1, sha256 hash.Hash
	cnt               [4][256]uint32
	total             [256]uint64
	pending           int64 // bytes counted into cnt since the last fold
	size              int64
}

func (d *digester) init() { d.md5, d.sha1, d.sha256 = md5.New(), sha1.New(), sha256.New() }

func (d *digester) write(p []byte) {
	for len(p) > 0 {
		c := p[:min(len(p), digestChunk)]
		p = p[len(c):]
		d.md5.Write(c)
		d.sha1.Write(c)
		d.sha256.Write(c)
		d.count(c)
	}
}

// count spreads bytes over four tables so consecutive increments of the
// same value do not wait on each other.
func (d *digester) count(c []byte) {
	d.size += int64(len(c))
	// Fold before a uint32 could overflow (4 x 2^31 bytes per fold).
	if d.pending+int64(len(c)) > 1<<31 {
		d.fold()
	}
	d.pending += int64(len(c))
	t0, t1, t2, t3 := &d.cnt[0], &d.cnt[1], &d.cnt[2], &d.cnt[3]
	i := 0
	for ; i+4 <= len(c); i += 4 {
		t0[c[i]]++
		t1[c[i+1]]++
		t2[c[i+2]]++
		t3[c[i+3]]++
	}
	for ; i < len(c); i++ {
		t0[c[i]]++
	}
}

func (d *digester) fold() {
	for b := range 256 {
		d.total[b] += uint64(d.cnt[0][b]) + uint64(d.cnt[1][b]) + uint64(d.cnt[2][b]) + uint64(d.cnt[3][b])
	}
	d.cnt = [4][256]uint32{}
	d.pending = 0
}

func (d *digester) sum() Digests {
	d.fold()
	// H = log2(n) - Σ c·log2(c) / n, with one natural log per symbol.
	var h float64
	if d.size > 0 {
		n := float64(d.size)
		var sum float64
		for _, c := range d.total {
			if c > 1 {
				sum += float64(c) * math.Log(float64(c))
			}
		}
		h = max(0, math.Log2(n)-sum/(n*math.Ln2))
	}
	var buf [sha256.Size]byte
	return Digests{
		MD5:     hex.EncodeToString(d.md5.Sum(buf[:0])),
		SHA1:    hex.EncodeToString(d.sha1.Sum(buf[:0])),
		SHA256:  hex.EncodeToString(d.sha256.Sum(buf[:0])),
		Size:    d.size,
		Entropy: math.Round(h*1e4) / 1e4,
	}
}

// Digest hashes r in a single pass.
func Digest(r io.Reader) (Digests, error) {
	var d digester
	d.init()
	bufSize := int64(digestChunk * 2)
	// Small files are the common case: size the buffer to the file when the
	// reader can tell us.
	switch v := r.(type) {
	case interface{ Len() int }:
		bufSize = min(bufSize, int64(v.Len())+1)
	case interface{ Size() int64 }: // io.SectionReader
		bufSize = min(bufSize, v.Size()+1)
	case interface{ Stat() (fs.FileInfo, error) }:
		if fi, err := v.Stat(); err == nil && fi.Mode().IsRegular() {
			bufSize = min(bufSize, fi.Size()+1)
		}
	}
	buf := make([]byte, max(bufSize, 512))
	for {
		n, err := r.Read(buf)
		d.write(buf[:n])
		if errors.Is(err, io.EOF) {
			return d.sum(), nil
		}
		if err != nil {
			return Digests{}, err
		}
	}
}

// DigestBytes is Digest for an in-memory file.
func DigestBytes(b []byte) Digests {
	var d digester
	d.init()
	d.write(b)
	return d.sum()
}
