package packet

import (
	"bytes"
	"math/rand"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
)

// Valid captures with random bytes overwritten never panic and never hold
// more connections than the bound.
func TestRandomCorruption(t *testing.T) {
	seeds := seedCaptures(t)
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 2000; i++ {
		s := append([]byte(nil), seeds[rng.Intn(len(seeds))]...)
		for k := 0; k < 1+rng.Intn(8); k++ {
			s[rng.Intn(len(s))] = byte(rng.Intn(256))
		}
		rd, err := capfile.NewReader(bytes.NewReader(s))
		if err != nil {
			continue
		}
		d := New(Config{MaxFlows: 8, Origin: origin(), Sink: discard{}})
		var p capfile.Packet
		for rd.Next(&p) == nil {
			d.Packet(&p)
			if d.flows.n > 8 {
				t.Fatalf("input %d: %d flows held", i, d.flows.n)
			}
		}
		d.Finish()
	}
}
