package netlab

// ProbeNames are the probe guests' namespaces and ports for a lab, so that
// a test can tell that none is left.
func ProbeNames(cfg *Config) []string {
	p, err := newProber(cfg)
	if err != nil {
		return nil
	}
	return []string{p.a.NS, p.b.NS}
}
