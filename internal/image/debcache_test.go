package image

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestAddToDebCache: a build's downloads enter the cache whole, by
// rename, from the same filesystem or another (/dev/shm), a .deb the cache
// has is kept as it is, and nothing else the build's apt left is taken.
func TestAddToDebCache(t *testing.T) {
	dirs := map[string]string{"same filesystem": t.TempDir()}
	if shm, err := os.MkdirTemp("/dev/shm", "tb-debcache-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(shm) })
		dirs["another filesystem"] = shm
	}
	for name, fetched := range dirs {
		t.Run(name, func(t *testing.T) {
			cache := t.TempDir()
			if err := os.WriteFile(filepath.Join(cache, "a_1_amd64.deb"), []byte("cached"), 0o644); err != nil {
				t.Fatal(err)
			}
			for f, data := range map[string]string{"a_1_amd64.deb": "downloaded again", "b_1_amd64.deb": "new", "lock": "", "partial.deb.tmp": "x"} {
				if err := os.WriteFile(filepath.Join(fetched, f), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := addToDebCache(context.Background(), fetched, cache); err != nil {
				t.Fatal(err)
			}
			ents, err := os.ReadDir(cache)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if want := []string{".lock", "a_1_amd64.deb", "b_1_amd64.deb"}; !slices.Equal(names, want) {
				t.Errorf("cache holds %v, want %v", names, want)
			}
			for f, want := range map[string]string{"a_1_amd64.deb": "cached", "b_1_amd64.deb": "new"} {
				if b, _ := os.ReadFile(filepath.Join(cache, f)); string(b) != want {
					t.Errorf("%s holds %q, want %q", f, b, want)
				}
			}
		})
	}
}
