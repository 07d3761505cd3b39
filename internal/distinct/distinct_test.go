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
