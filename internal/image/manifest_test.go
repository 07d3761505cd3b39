package image

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func noLock(context.Context, string) (func(), error) { return func() {}, nil }

// fakeImage writes a small image directory with a signed manifest.
func fakeImage(t *testing.T, dir string, k Key, spec, version, build string) *Manifest {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var produced []records.ImageFile
	for _, f := range [][2]string{{DiskFile, "disk"}, {KernelFile, "kernel"}, {InitrdFile, "initrd"}} {
		p := filepath.Join(dir, f[0])
		if err := os.WriteFile(p, []byte(f[0]+" of "+version+strings.Repeat("x", 1000)), 0o644); err != nil {
			t.Fatal(err)
		}
		sum, size, err := files.SHA256(p)
		if err != nil {
			t.Fatal(err)
		}
		produced = append(produced, records.ImageFile{Name: f[0], Role: f[1], SHA256: sum, Size: size})
	}
	m := &Manifest{Spec: spec, SpecVersion: "1.0.0", Version: version, Build: build, Platform: "amd64",
		Packages: []Package{{Name: "qemu-guest-agent", Version: "1:7.2", Arch: "amd64"}}, Files: produced}
	if err := WriteSigned(dir, m, k); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestKeyCreatedOnceAndReloaded(t *testing.T) {
	root := t.TempDir()
	k1, err := LoadOrCreateKey(context.Background(), root, noLock)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := LoadOrCreateKey(context.Background(), root, noLock)
	if err != nil {
		t.Fatal(err)
	}
	if !k1.Public.Equal(k2.Public) || k1.ID() != k2.ID() || len(k1.ID()) != 16 {
		t.Fatal("second use made a new key")
	}
	fi, err := os.Stat(filepath.Join(keyDir(root), "ed25519.key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("private key mode: %v %v", fi.Mode(), err)
	}
	pub, err := LoadPublicKey(root)
	if err != nil || !pub.Equal(k1.Public) {
		t.Fatalf("public key: %v", err)
	}
}

func TestVerifyGoodImage(t *testing.T) {
	root := t.TempDir()
	k, _ := LoadOrCreateKey(context.Background(), root, noLock)
	dir := filepath.Join(root, "img")
	fakeImage(t, dir, k, "s", "1.0.0+build.1", "build_x")
	m, probs := VerifyDir(dir, k.Public)
	if len(probs) != 0 || m == nil || m.KeyID != k.ID() || m.Format != ManifestFormat {
		t.Fatalf("good image: %v %+v", probs, m)
	}
}

// Every kind of tampering is found and names the file.
func TestVerifyTamper(t *testing.T) {
	cases := map[string]struct {
		tamper func(t *testing.T, dir string)
		file   string
		reason string
	}{
		"disk byte": {func(t *testing.T, dir string) { flipByte(t, filepath.Join(dir, DiskFile), 500) }, DiskFile, "sha256"},
		"kernel replaced": {func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, KernelFile), []byte("evil"), 0o644)
		}, KernelFile, "size"},
		"initrd gone": {func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, InitrdFile)) }, InitrdFile, "unreadable"},
		"manifest edited": {func(t *testing.T, dir string) {
			p := filepath.Join(dir, ManifestFile)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, []byte(strings.Replace(string(b), "1:7.2", "1:7.3", 1)), 0o644)
		}, ManifestFile, "signature does not match"},
		"signature edited": {func(t *testing.T, dir string) {
			p := filepath.Join(dir, SignatureFile)
			b, _ := os.ReadFile(p)
			f := strings.Fields(string(b))
			sig := []byte(f[2])
			if sig[5] == 'A' {
				sig[5] = 'B'
			} else {
				sig[5] = 'A'
			}
			os.WriteFile(p, []byte(f[0]+" "+f[1]+" "+string(sig)+"\n"), 0o644)
		}, ManifestFile, "signature does not match"},
		"signature missing": {func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, SignatureFile)) }, SignatureFile, "unreadable"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			k, _ := LoadOrCreateKey(context.Background(), root, noLock)
			dir := filepath.Join(root, "img")
			fakeImage(t, dir, k, "s", "1.0.0+build.1", "build_x")
			c.tamper(t, dir)
			_, probs := VerifyDir(dir, k.Public)
			if len(probs) == 0 {
				t.Fatal("tampering not detected")
			}
			found := false
			for _, p := range probs {
				if p.File == c.file && strings.Contains(p.Reason, c.reason) {
					found = true
				}
			}
			if !found {
				t.Fatalf("problems %v do not name %s (%s)", probs, c.file, c.reason)
			}
		})
	}
}

func TestVerifyRejectsOtherKey(t *testing.T) {
	root := t.TempDir()
	k, _ := LoadOrCreateKey(context.Background(), root, noLock)
	dir := filepath.Join(root, "img")
	fakeImage(t, dir, k, "s", "1.0.0+build.1", "build_x")
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	_, probs := VerifyDir(dir, other)
	if len(probs) != 1 || probs[0].File != SignatureFile || !strings.Contains(probs[0].Reason, "signed by key") {
		t.Fatalf("%v", probs)
	}
	// A manifest re-signed by another key is refused too.
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	m, _ := VerifyDir(dir, k.Public)
	WriteSigned(dir, m, Key{Private: priv, Public: priv.Public().(ed25519.PublicKey)})
	if _, probs := VerifyDir(dir, k.Public); len(probs) == 0 {
		t.Fatal("a manifest signed by a foreign key verified")
	}
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	f.ReadAt(b, off)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
