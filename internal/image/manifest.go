package image

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// ManifestFormat names this manifest layout.
const ManifestFormat = "talkbox-image-manifest/1"

// File names inside an image directory.
const (
	DiskFile      = "disk.qcow2"
	KernelFile    = "vmlinuz"
	InitrdFile    = "initrd.img"
	ManifestFile  = "manifest.json"
	SignatureFile = "manifest.sig"
)

// Manifest describes an image and everything in it; its ed25519 signature
// is in manifest.sig next to it.
type Manifest struct {
	Format      string              `json:"format"`
	Spec        string              `json:"spec"`
	SpecVersion string              `json:"spec_version"`
	SpecSHA256  string              `json:"spec_sha256"`
	Version     string              `json:"version"`
	BuildNumber int                 `json:"build_number"`
	Platform    string              `json:"platform"`
	OS          string              `json:"os"`
	Release     string              `json:"release"`
	Build       string              `json:"build"`
	Builder     string              `json:"builder"`
	Tool        string              `json:"tool"`
	Host        string              `json:"host"`
	StartedAt   time.Time           `json:"started_at"`
	FinishedAt  time.Time           `json:"finished_at"`
	Boot        records.ImageBoot   `json:"boot"`
	Packages    []Package           `json:"packages"`
	Files       []records.ImageFile `json:"files"`
	KeyID       string              `json:"key_id"`
}

// Key is the ed25519 signing key of this state directory.
type Key struct {
	Private ed25519.PrivateKey
	Public  ed25519.PublicKey
}

// ID is a short name of the public key: the first 16 hex digits of its sha256.
func (k Key) ID() string { return KeyID(k.Public) }

// KeyID names a public key.
func KeyID(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return hex.EncodeToString(h[:8])
}

// keyDir is where the signing key lives, readable by root only.
func keyDir(stateRoot string) string { return filepath.Join(stateRoot, "keys", "tb-build") }

// LoadOrCreateKey returns the state directory's signing key, creating it on
// first use. lock serialises creation between processes.
func LoadOrCreateKey(ctx context.Context, stateRoot string, lock func(context.Context, string) (func(), error)) (Key, error) {
	dir := keyDir(stateRoot)
	if k, err := loadKey(dir); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	unlock, err := lock(ctx, "tb-build/key")
	if err != nil {
		return Key{}, err
	}
	defer unlock()
	if k, err := loadKey(dir); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Key{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Key{}, err
	}
	if err := files.WriteAtomic(filepath.Join(dir, "ed25519.pub"), []byte(base64.StdEncoding.EncodeToString(pub)+"\n"), 0o644); err != nil {
		return Key{}, err
	}
	if err := files.WriteAtomic(filepath.Join(dir, "ed25519.key"), []byte(base64.StdEncoding.EncodeToString(priv.Seed())+"\n"), 0o600); err != nil {
		return Key{}, err
	}
	return Key{Private: priv, Public: pub}, nil
}

func loadKey(dir string) (Key, error) {
	b, err := os.ReadFile(filepath.Join(dir, "ed25519.key"))
	if err != nil {
		return Key{}, err
	}
	seed, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(seed) != ed25519.SeedSize {
		return Key{}, fmt.Errorf("%s/ed25519.key is not a base64 ed25519 seed", dir)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	return Key{Private: priv, Public: priv.Public().(ed25519.PublicKey)}, nil
}

// LoadPublicKey reads the state directory's public key.
func LoadPublicKey(stateRoot string) (ed25519.PublicKey, error) {
	p := filepath.Join(keyDir(stateRoot), "ed25519.pub")
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	pub, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%s is not a base64 ed25519 public key", p)
	}
	return pub, nil
}

// WriteSigned writes manifest.json and manifest.sig into dir.
func WriteSigned(dir string, m *Manifest, k Key) error {
	m.Format = ManifestFormat
	m.KeyID = k.ID()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if err := files.WriteAtomic(filepath.Join(dir, ManifestFile), b, 0o644); err != nil {
		return err
	}
	sig := ed25519.Sign(k.Private, b)
	line := fmt.Sprintf("ed25519 %s %s\n", k.ID(), base64.StdEncoding.EncodeToString(sig))
	return files.WriteAtomic(filepath.Join(dir, SignatureFile), []byte(line), 0o644)
}

// Problem is one thing wrong with an image on disk, naming the file.
type Problem struct {
	File   string
	Reason string
}

func (p Problem) String() string { return p.File + ": " + p.Reason }

// VerifyDir checks the manifest's signature with pub and every file's
// size and sha256. It returns the parsed manifest (nil if unreadable) and
// every problem found.
func VerifyDir(dir string, pub ed25519.PublicKey) (*Manifest, []Problem) {
	var probs []Problem
	mb, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, []Problem{{ManifestFile, "unreadable: " + err.Error()}}
	}
	sb, err := os.ReadFile(filepath.Join(dir, SignatureFile))
	if err != nil {
		probs = append(probs, Problem{SignatureFile, "unreadable: " + err.Error()})
	} else if f := strings.Fields(string(sb)); len(f) != 3 || f[0] != "ed25519" {
		probs = append(probs, Problem{SignatureFile, "malformed (want: ed25519 KEYID BASE64)"})
	} else if f[1] != KeyID(pub) {
		probs = append(probs, Problem{SignatureFile, fmt.Sprintf("signed by key %s, not this state directory's key %s", f[1], KeyID(pub))})
	} else if sig, err := base64.StdEncoding.DecodeString(f[2]); err != nil || !ed25519.Verify(pub, mb, sig) {
		probs = append(probs, Problem{ManifestFile, "signature does not match (manifest modified or signature forged)"})
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(mb))
	if err := dec.Decode(&m); err != nil || m.Format != ManifestFormat {
		return nil, append(probs, Problem{ManifestFile, "not a " + ManifestFormat + " manifest"})
	}
	for _, f := range m.Files {
		if f.Name != filepath.Base(f.Name) || f.Name == "." || f.Name == ".." {
			probs = append(probs, Problem{f.Name, "file name leaves the image directory"})
			continue
		}
		sum, size, err := files.SHA256(filepath.Join(dir, f.Name))
		switch {
		case err != nil:
			probs = append(probs, Problem{f.Name, "unreadable: " + err.Error()})
		case size != f.Size:
			probs = append(probs, Problem{f.Name, fmt.Sprintf("size %d, manifest says %d", size, f.Size)})
		case sum != f.SHA256:
			probs = append(probs, Problem{f.Name, "sha256 " + sum + " does not match the manifest's " + f.SHA256})
		}
	}
	return &m, probs
}
