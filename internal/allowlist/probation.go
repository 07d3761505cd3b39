package allowlist

import (
	"context"
	"errors"
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// InForce is, for each cycle, the keys of the entries its lease's chain
// enforced while it ran: those of the revision the cycle record names as
// in force when it started (a cycle applies its lease's allow list before
// it runs). A cycle without a record, or whose record names no revision,
// ran with nothing let through. This is what tells an answer of the real
// far side (the endpoint was let through) from the sinkhole's.
func (b *Book) InForce(ctx context.Context, cycles []string) (map[string]map[string]bool, error) {
	out := map[string]map[string]bool{}
	byRev := map[string]map[string]bool{}
	for _, id := range cycles {
		if _, done := out[id]; done || records.CheckID(id) != nil || records.KindOf(id) != "cycle" {
			continue
		}
		var c records.Cycle
		if err := b.St.Get(id, &c); err != nil {
			if errors.Is(err, state.ErrNotFound) {
				out[id] = nil
				continue
			}
			return nil, fmt.Errorf("cycle %s: %w", id, err)
		}
		if c.Revision == "" {
			out[id] = nil
			continue
		}
		keys, ok := byRev[c.Revision]
		if !ok {
			_, entries, err := b.Revision(ctx, c.Revision)
			if err != nil {
				return nil, fmt.Errorf("cycle %s: the revision in force: %w", id, err)
			}
			keys = map[string]bool{}
			for _, e := range entries {
				if enforced(e.Status) {
					keys[EntryKey(e)] = true
				}
			}
			byRev[c.Revision] = keys
		}
		out[id] = keys
	}
	return out, nil
}

// cyclesOf are the cycles observables were seen in, and the one promoted.
func cyclesOf(obs []*records.Observable, promoted string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(c string) {
		if c != "" && !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	add(promoted)
	for _, o := range obs {
		add(o.Cycle)
		for _, c := range o.Cycles {
			add(c)
		}
	}
	return out
}

// destCycles are the cycles a promotion's evidence of what far sides did
// names, and the one promoted.
func destCycles(p Promotion) []string {
	var obs []*records.Observable
	for _, d := range p.Dests {
		for _, lists := range [][][]string{d.heard.answered, d.heard.spoke, d.heard.conversed} {
			for _, cs := range lists {
				obs = append(obs, &records.Observable{Cycles: cs})
			}
		}
	}
	return cyclesOf(obs, p.Cycle)
}
