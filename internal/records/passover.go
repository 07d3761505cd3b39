package records

import (
	"log/slog"
	"maps"
	"slices"
)

// PassedOver counts, by kind, the records a tool read and did not use.
// A tool that reads records takes the kinds it uses and passes over the
// others, so that pipes compose (tb-parse prints artifact records among
// its observables); it says how many in its log, so that nothing is
// dropped unseen.
type PassedOver map[string]int

// Add counts one record of kind passed over.
func (p PassedOver) Add(kind string) { p[kind]++ }

// Log logs one line per kind passed over, in kind order.
func (p PassedOver) Log(log *slog.Logger) {
	for _, k := range slices.Sorted(maps.Keys(p)) {
		log.Info("passed over records it does not use", "kind", k, "count", p[k])
	}
}
