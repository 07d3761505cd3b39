package distinct

import "testing"

func TestDistinct(t *testing.T) {
	var d Counter
	for i := 0; i < 100; i++ {
		d.Add(uint64(i % 50))
	}
	if n, est := d.Count(); n != 50 || est {
		t.Errorf("%d %v", n, est)
	}
	for i := 0; i < 3*Exact; i++ {
		d.Add(uint64(i))
	}
	if n, est := d.Count(); !est || n < 3*Exact*95/100 || n > 3*Exact*105/100 {
		t.Errorf("%d %v", n, est)
	}
}

// Two counts' sketches, written out and read back, unite into the count of
// the union of their keys: a lease's scan over several cycles is counted
// once per destination, not once per cycle.
func TestSketchesUnite(t *testing.T) {
	var a, b Counter
	for i := range 10000 {
		a.Add(uint64(i))
		b.Add(uint64(5000 + i))
	}
	union := NewSketch()
	for _, c := range []*Counter{&a, &b} {
		sk, err := ParseSketch(c.Sketch().String())
		if err != nil {
			t.Fatal(err)
		}
		union.Union(sk)
	}
	if n := union.Estimate(); n < 15000*95/100 || n > 15000*105/100 {
		t.Errorf("united estimate %d, want about 15000", n)
	}
	if _, err := ParseSketch("AAAA"); err == nil {
		t.Error("a sketch of 3 registers was read")
	}
}

// A small count keeps no sketch until StartSketch, and then one that holds
// what was counted before.
func TestStartSketch(t *testing.T) {
	var c Counter
	for i := range 100 {
		c.Add(uint64(i))
	}
	if c.Sketch() != nil || !c.AtLeast(100) || c.AtLeast(101) {
		t.Fatalf("sketch %v, at least 100 %v, 101 %v", c.Sketch() != nil, c.AtLeast(100), c.AtLeast(101))
	}
	c.StartSketch()
	if n := c.Sketch().Estimate(); n < 95 || n > 105 {
		t.Errorf("sketch estimates %d of 100 keys", n)
	}
	if n, est := c.Count(); n != 100 || est {
		t.Errorf("count %d estimated %v after StartSketch, want the exact 100", n, est)
	}
}
