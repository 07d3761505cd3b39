package yarascan

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// What a scanned file is (records.YaraInfo.Target).
const (
	TargetSample  = "sample"
	TargetDropped = "dropped"
	TargetMemory  = "memory"
)

// File is a file the rules ran over, as its observables name it.
type File struct {
	Target string
	SHA256 string
	// Artifact and Sample are its records, when it has them; Lease and
	// Cycle where it was found (none for a sample at tb-plan).
	Artifact, Sample string
	Lease, Cycle     string
	// Input names it in the provenance: a path, or the artifact's type.
	Input string
}

// Record stores the observable of each match in f: created the first time
// a rule matches that content on that lease, merged into (another cycle,
// another sighting) after. It returns them as stored.
func Record(ctx context.Context, st *state.Store, f File, ms []records.YaraMatch) ([]*records.Observable, error) {
	var out []*records.Observable
	for _, m := range ms {
		name := m.Namespace + ":" + m.Rule
		origin := observe.Origin{Cycle: f.Cycle, Artifact: f.Artifact, Input: f.Input, Source: "yara"}
		o := origin.New(records.ObsYara, name, st.Now(), 0, 0)
		o.Lease = f.Lease
		o.Yara = &records.YaraInfo{YaraMatch: m, Target: f.Target, SHA256: f.SHA256, Artifact: f.Artifact, Sample: f.Sample}
		// The observables' index, keyed once per lease, rule and content.
		sum := sha256.Sum256([]byte(f.Lease + "\x00" + records.ObsYara + "\x00" + name + "\x00" + f.SHA256))
		id, created, err := st.Claim(ctx, records.KindObservable, hex.EncodeToString(sum[:]), func() (records.Record, error) {
			records.Init(o, records.KindObservable, st.Now())
			return o, nil
		})
		if err != nil {
			return out, fmt.Errorf("storing the match of %s: %w", name, err)
		}
		if created {
			out = append(out, o)
			continue
		}
		var cur records.Observable
		if err := st.Update(ctx, id, &cur, func(exists bool) error {
			if !exists {
				return fmt.Errorf("%s: %w", id, state.ErrNotFound)
			}
			observe.Merge(&cur, o)
			return nil
		}); err != nil {
			return out, fmt.Errorf("storing the match of %s: %w", name, err)
		}
		out = append(out, &cur)
	}
	return out, nil
}
