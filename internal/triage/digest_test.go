package triage

import (
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"testing/iotest"
)

func refDigests(b []byte) Digests {
	m, s1, s2 := md5.Sum(b), sha1.Sum(b), sha256.Sum256(b)
	return Digests{MD5: hex.EncodeToString(m[:]), SHA1: hex.EncodeToString(s1[:]),
		SHA256: hex.EncodeToString(s2[:]), Size: int64(len(b))}
}

func TestDigest(t *testing.T) {
	empty := DigestBytes(nil)
	if empty.MD5 != "d41d8cd98f00b204e9800998ecf8427e" ||
		empty.SHA1 != "da39a3ee5e6b4b0d3255bfef95601890afd80709" ||
		empty.SHA256 != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" ||
		empty.Size != 0 || empty.Entropy != 0 {
		t.Errorf("empty: %+v", empty)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 3, 4, 5, 255, digestChunk - 1, digestChunk, digestChunk + 1, 3*digestChunk + 7, 1 << 20} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		want := refDigests(b)
		got := DigestBytes(b)
		want.Entropy = got.Entropy
		if got != want {
			t.Errorf("n=%d: DigestBytes = %+v, want %+v", n, got, want)
		}
		for name, r := range map[string]any{
			"bytes.Reader": bytes.NewReader(b),
			"one byte":     iotest.OneByteReader(bytes.NewReader(b)),
			"half":         iotest.HalfReader(bytes.NewReader(b)),
			"data+EOF":     iotest.DataErrReader(bytes.NewReader(b)),
		} {
			if n > 1<<16 && name == "one byte" {
				continue
			}
			got2, err := Digest(r.(interface{ Read([]byte) (int, error) }))
			if err != nil || got2 != got {
				t.Errorf("n=%d %s: Digest = %+v, %v; want %+v", n, name, got2, err, got)
			}
		}
	}
	// A file: the buffer is sized from Stat.
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, []byte("hello, file"), 0o644)
	f, _ := os.Open(p)
	defer f.Close()
	if got, err := Digest(f); err != nil || got != DigestBytes([]byte("hello, file")) {
		t.Errorf("file: %+v, %v", got, err)
	}
	boom := errors.New("boom")
	if _, err := Digest(iotest.ErrReader(boom)); !errors.Is(err, boom) {
		t.Errorf("error reader: err = %v", err)
	}
}

func TestEntropy(t *testing.T) {
	all := make([]byte, 256*64)
	for i := range all {
		all[i] = byte(i)
	}
	cases := []struct {
		data []byte
		want float64
	}{
		{bytes.Repeat([]byte{0}, 1000), 0},
		{[]byte("a"), 0},
		{bytes.Repeat([]byte("ab"), 500), 1},
		{bytes.Repeat([]byte("abcd"), 3), 2},
		{all, 8},
		{[]byte("aab"), 0.9183}, // -(2/3)log2(2/3) - (1/3)log2(1/3) rounded
	}
	for _, c := range cases {
		if got := DigestBytes(c.data).Entropy; got != c.want {
			t.Errorf("entropy(%q…) = %v, want %v", c.data[:min(8, len(c.data))], got, c.want)
		}
	}
}

// TestDigestFold checks the uint32 tables are folded before they overflow.
func TestDigestFold(t *testing.T) {
	var d digester
	d.init()
	d.cnt[0]['x'] = 1<<32 - 2 // as if 4 GiB of 'x' were pending
	d.pending = 1<<31 - 2
	d.count([]byte("xxxxyyyy"))
	d.fold()
	if d.total['x'] != 1<<32-2+4 || d.total['y'] != 4 {
		t.Errorf("totals x=%d y=%d", d.total['x'], d.total['y'])
	}
}
