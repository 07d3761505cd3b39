package state

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// recordPtr is a pointer to a record struct, so that Find can make a fresh
// one for each record it decodes.
type recordPtr[T any] interface {
	*T
	records.Record
}

// Find returns the records of a kind that keep accepts (all, if keep is
// nil), oldest first. A record deleted while Find reads is left out; one
// that does not decode is an error.
func Find[T any, P recordPtr[T]](s *Store, kind string, keep func(P) bool) ([]P, error) {
	ids, err := s.List(kind)
	if err != nil {
		return nil, err
	}
	return load[T, P](s, ids, false, keep, -1)
}

// FindBy is Find over the records stored with field = value (records.Keyed),
// without reading the others.
func FindBy[T any, P recordPtr[T]](s *Store, kind, field, value string, keep func(P) bool) ([]P, error) {
	ids, err := s.ByKey(kind, field, value)
	if err != nil {
		return nil, err
	}
	return load[T, P](s, ids, false, byKey(field, value, keep), -1)
}

// LatestBy returns the newest record of a kind stored with field = value
// that keep accepts, or an error wrapping ErrNotFound.
func LatestBy[T any, P recordPtr[T]](s *Store, kind, field, value string, keep func(P) bool) (P, error) {
	ids, err := s.ByKey(kind, field, value)
	if err != nil {
		return nil, err
	}
	found, err := load[T, P](s, ids, true, byKey(field, value, keep), 1)
	return first(kind, found, err)
}

// byKey accepts what keep accepts among the records that still have the
// key: a key outlives a value the record no longer has (keys.go).
func byKey[P records.Record](field, value string, keep func(P) bool) func(P) bool {
	return func(r P) bool {
		k, ok := any(r).(records.Keyed)
		if !ok || !slices.Contains(k.IndexKeys(), records.IndexKey{Field: field, Value: value}) {
			return false
		}
		return keep == nil || keep(r)
	}
}

func first[P any](kind string, found []P, err error) (P, error) {
	if err != nil || len(found) == 0 {
		var zero P
		return zero, cmp.Or(err, fmt.Errorf("no such %s: %w", kind, ErrNotFound))
	}
	return found[0], nil
}

// load decodes ids (newest first if reverse) and keeps those keep accepts,
// stopping after limit of them (limit < 0: all).
func load[T any, P recordPtr[T]](s *Store, ids []string, reverse bool, keep func(P) bool, limit int) ([]P, error) {
	if reverse {
		ids = slices.Clone(ids)
		slices.Reverse(ids)
	}
	var out []P
	for _, id := range ids {
		r := P(new(T))
		if err := s.Get(id, r); err != nil {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			return nil, err
		}
		if keep != nil && !keep(r) {
			continue
		}
		if out = append(out, r); len(out) == limit {
			break
		}
	}
	return out, nil
}
