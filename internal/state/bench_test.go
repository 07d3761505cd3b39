package state

import (
	"bytes"
	"context"
	"math/rand"
	"testing"
)

func benchCreate(b *testing.B, d Durability) {
	ctx := context.Background()
	s := openT(b, b.TempDir(), WithDurability(d))
	b.ReportAllocs()
	for b.Loop() {
		c := newCounter(s)
		c.Note = "benchmark record"
		if err := s.Create(ctx, c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCreate(b *testing.B) {
	b.Run("SyncOnFlush", func(b *testing.B) { benchCreate(b, SyncOnFlush) })
	b.Run("SyncEachWrite", func(b *testing.B) { benchCreate(b, SyncEachWrite) })
}

func BenchmarkUpdate(b *testing.B) {
	for _, d := range []struct {
		name string
		d    Durability
	}{{"SyncOnFlush", SyncOnFlush}, {"SyncEachWrite", SyncEachWrite}} {
		b.Run(d.name, func(b *testing.B) {
			ctx := context.Background()
			s := openT(b, b.TempDir(), WithDurability(d.d))
			c := newCounter(s)
			if err := s.Create(ctx, c); err != nil {
				b.Fatal(err)
			}
			var r counterRec
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Update(ctx, c.ID, &r, func(bool) error { r.Total++; return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkPutBlob64KiB(b *testing.B) {
	for _, d := range []struct {
		name string
		d    Durability
	}{{"SyncOnFlush", SyncOnFlush}, {"SyncEachWrite", SyncEachWrite}} {
		b.Run(d.name, func(b *testing.B) {
			ctx := context.Background()
			s := openT(b, b.TempDir(), WithDurability(d.d))
			buf := make([]byte, 64<<10)
			rng := rand.New(rand.NewSource(1))
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				rng.Read(buf[:16]) // new content each time
				if _, err := s.PutBlob(ctx, bytes.NewReader(buf)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
