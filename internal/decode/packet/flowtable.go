package packet

// flowTable finds a connection by its 5-tuple's hash: open addressing with
// linear probing over slots that hold the hash beside the flow, so that a
// probe past another tuple's slot reads no flow, and a lookup reads the
// slot's cache line and then the flow, which the packet updates anyway. A
// Go map keyed by the hash hashed it again and matched control bytes first
// (a tenth of parsing a capture of many short connections).
type flowTable struct {
	slots []flowSlot // a power of two long, at most half full
	n     int
}

type flowSlot struct {
	h uint64
	f *flow // nil: empty
}

const flowTableMin = 1024

// find returns the flow of key, whose hash is h.
func (t *flowTable) find(h uint64, key *flowKey) *flow {
	if t.slots == nil {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.f == nil {
			return nil
		}
		if s.h == h && s.f.key == *key {
			return s.f
		}
	}
}

// insert adds f, whose hash is f.hash and whose key is not in the table.
func (t *flowTable) insert(f *flow) {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	t.place(f)
	t.n++
}

func (t *flowTable) place(f *flow) {
	mask := uint64(len(t.slots) - 1)
	i := f.hash & mask
	for t.slots[i].f != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = flowSlot{f.hash, f}
}

func (t *flowTable) grow() {
	old := t.slots
	t.slots = make([]flowSlot, max(flowTableMin, 2*len(old)))
	for _, s := range old {
		if s.f != nil {
			t.place(s.f)
		}
	}
}

// remove takes f out of the table (it must be in it), shifting back the
// slots after it that its own made probe further, so that no probe meets
// an empty slot before its flow.
func (t *flowTable) remove(f *flow) {
	mask := uint64(len(t.slots) - 1)
	i := f.hash & mask
	for t.slots[i].f != f {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; t.slots[j].f != nil; j = (j + 1) & mask {
		// home is where the slot at j would be with no collision; it stays
		// unless i lies cyclically in [home, j).
		home := t.slots[j].h & mask
		if (j-home)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = flowSlot{}
	t.n--
}

// first returns a flow of the table, nil if it is empty.
func (t *flowTable) first() *flow {
	for _, s := range t.slots {
		if s.f != nil {
			return s.f
		}
	}
	return nil
}
