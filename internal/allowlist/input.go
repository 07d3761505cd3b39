package allowlist

import (
	"errors"
	"io"
	"log/slog"
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Selector picks chains: a lease's (its own with Scope lease, else the
// three that apply to it), a sample's, the global one, or every chain.
type Selector struct {
	Lease  string
	Scope  string
	Sample string
}

// Chains are the chains the selector picks.
func (s Selector) Chains(b *Book) ([]Chain, error) {
	switch {
	case s.Scope == records.ScopeGlobal:
		return []Chain{{Scope: records.ScopeGlobal}}, nil
	case s.Scope == records.ScopeSample || s.Sample != "":
		c := Chain{Scope: records.ScopeSample, Sample: s.Sample}
		return []Chain{c}, c.Check()
	case s.Lease != "":
		if s.Scope == records.ScopeLease {
			c := Chain{Scope: records.ScopeLease, Lease: s.Lease}
			return []Chain{c}, c.Check()
		}
		return b.ChainsOf(s.Lease), nil
	case s.Scope == records.ScopeLease:
		return nil, fault.Usage(errors.New("--scope lease needs --lease"))
	}
	return b.Chains()
}

// Fault gives an error of this package its talkbox(7) class: a tampered
// chain or a malformed record or element is bad data (65), a missing record
// a failure (1); an error that has a class keeps it.
func Fault(err error) error {
	var te *TamperError
	var inv *firewall.InvalidError
	var le *records.LineError
	var ce *fault.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return err
	case errors.As(err, &te), errors.As(err, &inv), errors.As(err, &le):
		return fault.DataErr(err)
	case errors.Is(err, state.ErrNotFound):
		return fault.Failure(err)
	}
	return err
}

// Input says where observables come from: Stdin (JSON lines) when set, else
// the state (a lease's, optionally one cycle's). With Stdin, Lease and Cycle
// filter.
type Input struct {
	Stdin io.Reader
	Lease string
	Cycle string
}

// ReadObservables returns observables grouped by lease, and the leases in
// the order first seen. Records of other kinds (tb-parse prints its flow
// logs' artifact records among the observables) are passed over and
// counted in log, so that pipes compose; lines that are not records are
// passed to warnf, added to batch and skipped (bad data).
func ReadObservables(b *Book, in Input, log *slog.Logger, warnf func(format string, a ...any), batch *fault.Batch) (map[string][]*records.Observable, []string, error) {
	groups := map[string][]*records.Observable{}
	var order []string
	add := func(o *records.Observable) {
		lease := o.Lease
		if lease == "" {
			lease = in.Lease
		}
		if in.Lease != "" && lease != in.Lease {
			return
		}
		if in.Cycle != "" && o.Cycle != in.Cycle && !slices.Contains(o.Cycles, in.Cycle) {
			return
		}
		if _, ok := groups[lease]; !ok {
			order = append(order, lease)
		}
		groups[lease] = append(groups[lease], o)
	}
	if in.Stdin != nil {
		rd := records.NewReader(in.Stdin, "stdin")
		passed := records.PassedOver{}
		defer passed.Log(log)
		for {
			l, err := rd.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, nil, err
			}
			var o records.Observable
			if err := records.Unmarshal(l.Data, &o); err != nil {
				err = l.Err(err)
				warnf("%v", err)
				batch.Add(fault.DataErr(err))
				continue
			}
			if o.Kind != records.KindObservable {
				passed.Add(o.Kind)
				continue
			}
			add(&o)
		}
		return groups, order, nil
	}
	if in.Lease == "" {
		return nil, nil, fault.Usage(errors.New("no input: pipe observables on stdin, or give --lease (and --cycle) to read them from the state"))
	}
	// A cycle's observables are found by the cycle, without reading those
	// of the lease's other cycles (a long lease has hundreds).
	field, value := records.KeyLease, in.Lease
	if in.Cycle != "" {
		field, value = records.KeyCycle, in.Cycle
	}
	found, err := state.FindBy[records.Observable](b.St, records.KindObservable, field, value, nil)
	if err != nil {
		return nil, nil, fault.DataErr(err)
	}
	for _, o := range found {
		add(o)
	}
	return groups, order, nil
}
