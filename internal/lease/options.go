package lease

// Options are the settings every tb-lease command shares: the
// configuration file and what overrides it.
type Options struct {
	Config string
	Bridge string
	LabNet string
}

// Load reads the configuration the options describe: the file named (which
// must exist), or else <stateDir>/tb-lease/config.json if it does, with the
// bridge and the lab network overridden.
func (o Options) Load(stateDir string) (*Config, error) {
	def := stateDir + "/tb-lease/config.json"
	path := o.Config
	if path == "" {
		path = def
	}
	cfg, err := LoadConfig(path, path != def)
	if err != nil {
		return nil, err
	}
	if o.Bridge != "" {
		cfg.Bridge = o.Bridge
	}
	if o.LabNet != "" {
		cfg.LabNet = o.LabNet
		if err := cfg.check("--lab-net"); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}
