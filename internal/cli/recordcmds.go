package cli

import (
	"errors"
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// GetCmd prints stored records by ID, whatever their kind.
type GetCmd struct {
	IDs []string `arg:"" name:"id" help:"Record IDs (kind_ULID)."`
}

// Run prints each record; a missing or malformed ID is reported and the rest
// still printed.
func (c *GetCmd) Run(env *Env) (err error) {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	w := records.NewWriter(env.Stdout)
	defer w.Finish(&err)
	var batch fault.Batch
	for _, id := range c.IDs {
		raw, err := st.ReadRaw(id)
		if err != nil {
			if records.CheckID(id) != nil {
				err = fault.Usage(err)
			}
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		rec, err := records.Decode(raw)
		if err != nil {
			err = fault.DataErr(fmt.Errorf("%s: stored record does not decode: %w", id, err))
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		if err := w.Write(rec); err != nil {
			return err
		}
	}
	return batch.Err()
}

// ListCmd prints every stored record of some kinds, oldest first.
type ListCmd struct {
	Kind  []string `name:"kind" default:"${kinds}" help:"Record kinds to list (default: ${kinds})."`
	Limit int      `name:"limit" help:"Print at most this many records per kind, the newest ones (0: all)."`
}

// Run lists the records.
func (c *ListCmd) Run(env *Env) (err error) {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	w := records.NewWriter(env.Stdout)
	defer w.Finish(&err)
	for _, kind := range c.Kind {
		if !records.ValidKind(kind) {
			return fault.Usage(fmt.Errorf("invalid kind %q", kind))
		}
		ids, err := st.List(kind)
		if err != nil {
			return err
		}
		if c.Limit > 0 && len(ids) > c.Limit {
			ids = ids[len(ids)-c.Limit:]
		}
		for _, id := range ids {
			raw, err := st.ReadRaw(id)
			if errors.Is(err, state.ErrNotFound) {
				continue // deleted since the directory was read
			}
			if err != nil {
				return err
			}
			rec, err := records.Decode(raw)
			if err != nil {
				return fault.DataErr(fmt.Errorf("%s: stored record does not decode: %w", id, err))
			}
			if err := w.Write(rec); err != nil {
				return err
			}
		}
	}
	return nil
}
