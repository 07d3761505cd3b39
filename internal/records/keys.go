package records

// IndexKey is a secondary key the state store indexes a record under: the
// name of one of its fields and that field's value. A record may have
// several values for one field (an observable seen in several cycles).
type IndexKey struct {
	Field, Value string
}

// Keyed is a record the state store keeps secondary keys for, so that
// "the captures of lease L" or "the observables of cycle C" are found
// without reading every record of the kind.
type Keyed interface {
	IndexKeys() []IndexKey
}

func keysOf(pairs ...string) []IndexKey {
	var out []IndexKey
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			out = append(out, IndexKey{pairs[i], pairs[i+1]})
		}
	}
	return out
}

// The fields records are found by.
const (
	KeyLease  = "lease"
	KeySample = "sample"
	KeyCycle  = "cycle"
	KeyChain  = "chain"
	KeyHolder = "holder"
	KeyHost   = "host"
	// KeyOpen holds the cycles that have not ended (value "1"). The
	// directory keeps a key after its record changes (readers check), so
	// there it is every cycle ever; PostgreSQL keeps keys exact.
	KeyOpen = "open"
)

func (c *Capture) IndexKeys() []IndexKey { return keysOf(KeyLease, c.Lease) }

func (a *Artifact) IndexKeys() []IndexKey { return keysOf(KeyLease, a.Lease, KeyCycle, a.Cycle) }

func (c *Cycle) IndexKeys() []IndexKey {
	open := ""
	if !CycleTerminal(c.State) {
		open = "1"
	}
	return keysOf(KeyLease, c.Lease, KeySample, c.Sample, KeyOpen, open)
}

// A revision is found by the cycle whose promote wrote it (tb-run reads
// it back instead of tb-allow's output).
func (r *AllowRevision) IndexKeys() []IndexKey { return keysOf(KeyChain, r.Chain, KeyCycle, r.Cycle) }

func (l *SandboxLease) IndexKeys() []IndexKey { return keysOf(KeyHolder, l.Holder) }

// An observable is found by every cycle that saw it: Cycles is bounded,
// and Cycle (the latest) may have fallen out of it.
func (o *Observable) IndexKeys() []IndexKey {
	keys := keysOf(KeyLease, o.Lease, KeyCycle, o.Cycle)
	for _, c := range o.Cycles {
		if c != o.Cycle {
			keys = append(keys, IndexKey{KeyCycle, c})
		}
	}
	return keys
}
