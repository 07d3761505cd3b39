package allowlist

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
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

func (s Selector) chains(b *Book) ([]Chain, error) {
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
		return nil, cli.Usage(errors.New("--scope lease needs --lease"))
	}
	return b.Chains()
}

// exitErr maps this package's errors to talkbox(7) exit codes.
func exitErr(err error) error {
	var te *TamperError
	var inv *firewall.InvalidError
	var le *records.LineError
	var ce *cli.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return err
	case errors.As(err, &te), errors.As(err, &inv), errors.As(err, &le):
		return cli.DataErr(err)
	case errors.Is(err, state.ErrNotFound):
		return cli.Failure(err)
	}
	return err
}

func openBook(env *cli.Env) (*Book, error) {
	st, err := env.OpenState()
	if err != nil {
		return nil, err
	}
	return &Book{St: st}, nil
}

// Input says where observables come from: stdin, or the state (a lease's,
// optionally one cycle's).
type Input struct {
	FromStdin bool
	Lease     string
	Cycle     string
}

// readObservables returns observables grouped by lease. Lines that are not
// observables are reported and skipped (bad data).
func readObservables(env *cli.Env, b *Book, in Input, batch *cli.Batch) (map[string][]*records.Observable, []string, error) {
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
	if in.FromStdin {
		rd := records.NewReader(env.Stdin, "stdin")
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
				env.Warnf("%v", err)
				batch.Add(cli.DataErr(err))
				continue
			}
			if o.Kind != records.KindObservable {
				err := l.Err(fmt.Errorf("a %s record, not an observable", o.Kind))
				env.Warnf("%v", err)
				batch.Add(cli.DataErr(err))
				continue
			}
			add(&o)
		}
		return groups, order, nil
	}
	if in.Lease == "" {
		return nil, nil, cli.Usage(errors.New("no input: pipe observables on stdin, or give --lease (and --cycle) to read them from the state"))
	}
	ids, err := b.St.List(records.KindObservable)
	if err != nil {
		return nil, nil, err
	}
	for _, id := range ids {
		var o records.Observable
		if err := b.St.Get(id, &o); err != nil {
			if errors.Is(err, state.ErrNotFound) {
				continue
			}
			return nil, nil, cli.DataErr(fmt.Errorf("%s: %w", id, err))
		}
		if o.Lease == in.Lease {
			add(&o)
		}
	}
	return groups, order, nil
}

// labValidator is the firewall's validator for the lab's networks, with the
// documentation ranges as the policy says.
func labValidator(st *state.Store, lab string, pol *Policy) firewall.Policy {
	if m, err := netlab.Load(capture.LabDir(st, lab)); err == nil {
		if fw, err := m.Config.Firewall(); err == nil {
			p := fw.Policy(false)
			p.Documentation = pol.Documentation
			p.SMTPPorts = pol.SMTPPorts
			return p
		}
	}
	var def netlab.Config
	def.Defaults()
	p := firewall.Policy{Documentation: pol.Documentation, SMTPPorts: pol.SMTPPorts,
		Lab: []netip.Prefix{def.LabNet, def.SinkNet}}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					p.Host = append(p.Host, ip.Unmap())
				}
			}
		}
	}
	return p
}
