package netlab

import "context"

// Inspect is what the lab kept in dir looks like now (Lab.Status), for a
// test that brought it up with Up and holds no state store.
func Inspect(ctx context.Context, dir string) (*Status, error) {
	m, err := Load(dir)
	if err != nil {
		return nil, err
	}
	return inspect(ctx, m.Config)
}

// ProbeNames are the probe guests' namespaces and ports for a lab, so that
// a test can tell that none is left.
func ProbeNames(cfg *Config) []string {
	p, err := newProber(cfg)
	if err != nil {
		return nil
	}
	return []string{p.a.NS, p.b.NS}
}
