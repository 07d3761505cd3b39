package packet

import (
	"math/rand/v2"
	"testing"
)

// TestFlowTableAgainstAMap: random inserts and removes, with hashes
// crowded into a few slots at the table's end (so that runs wrap around)
// and shared by different tuples, find exactly what a map holds.
func TestFlowTableAgainstAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab flowTable
	model := map[flowKey]*flow{}
	var live []*flow
	keyOf := func(i int) flowKey { return flowKey{pa: uint16(i), pb: uint16(i >> 16), proto: 6} }
	for step := 0; step < 200000; step++ {
		if len(live) == 0 || rng.IntN(100) < 55 && len(live) < 3000 {
			k := keyOf(rng.IntN(1 << 20))
			if model[k] != nil {
				continue
			}
			// Hashes in the last 16 slots of a 1,024-slot table, or of
			// any size: runs wrap past the end; one hash in 8 is shared.
			h := uint64(rng.IntN(16)) - 16
			if rng.IntN(8) > 0 {
				h = rng.Uint64()
			}
			f := &flow{key: k, hash: h}
			tab.insert(f)
			model[k] = f
			live = append(live, f)
		} else {
			i := rng.IntN(len(live))
			f := live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			tab.remove(f)
			delete(model, f.key)
		}
		if step%97 == 0 || len(live) < 4 {
			if tab.n != len(model) {
				t.Fatalf("step %d: table holds %d, map %d", step, tab.n, len(model))
			}
			for _, f := range live {
				if got := tab.find(f.hash, &f.key); got != f {
					t.Fatalf("step %d: find of a flow in the table = %p, want %p", step, got, f)
				}
			}
			k := keyOf(1<<20 + step)
			if got := tab.find(uint64(step)-16, &k); got != nil {
				t.Fatalf("step %d: found a tuple never inserted", step)
			}
		}
	}
	for _, f := range live {
		tab.remove(f)
	}
	if tab.n != 0 || tab.first() != nil {
		t.Fatalf("%d flows left", tab.n)
	}
}
