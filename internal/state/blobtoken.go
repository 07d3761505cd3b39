package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// BlobToken is the secret a fleet's blob servers ask of each fetch
// (blobshare): made once, at random, and kept where every host of the
// fleet, and no one else, reads it: in the shared database (table
// talkbox_secrets), or, for a store of its own, in a file only its owner
// reads (blobshare.token in the state directory).
func (s *Store) BlobToken(ctx context.Context) (string, error) {
	if pg, ok := s.rec.(*pgStore); ok {
		return pg.secret(ctx, "blob-token")
	}
	return fileSecret(filepath.Join(s.root, "blobshare.token"))
}

func newSecret() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// secret returns the named secret of the database, made the first time;
// the table is created here, not by migrate, so that databases made before
// it get it too.
func (s *pgStore) secret(ctx context.Context, name string) (string, error) {
	var v string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := xactLock(ctx, tx, "schema", ""); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS talkbox_secrets (name text PRIMARY KEY, value text NOT NULL)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO talkbox_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, newSecret()); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT value FROM talkbox_secrets WHERE name = $1`, name).Scan(&v)
	})
	if err != nil {
		return "", pgErr(fmt.Errorf("shared database: secret %s: %w", name, err))
	}
	return v, nil
}

// fileSecret returns the secret in path, made (mode 0600) the first time.
func fileSecret(path string) (string, error) {
	for {
		b, err := os.ReadFile(path)
		if err == nil && len(strings.TrimSpace(string(b))) > 0 {
			return strings.TrimSpace(string(b)), nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		// Written whole under a temporary name, then linked: a reader
		// never sees it half-written, and of two makers one wins.
		tmp, err := createTemp(filepath.Dir(path), ".secret-")
		if err != nil {
			return "", err
		}
		_, werr := tmp.WriteString(newSecret() + "\n")
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr); err != nil {
			os.Remove(tmp.Name())
			return "", err
		}
		err = os.Link(tmp.Name(), path)
		os.Remove(tmp.Name())
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
}
