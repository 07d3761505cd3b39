package lease

import "github.com/talkbox-sandbox/talkbox/internal/virt"

// Options are the settings every tb-lease command shares: the
// configuration file and what overrides it.
type Options struct {
	Config string
	Bridge string
	LabNet string
	// HostName names the local libvirtd when the configuration lists no
	// hosts (default "local"): a fleet host's name.
	HostName string
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
	if o.HostName != "" && len(cfg.Hosts) == 1 && cfg.Hosts[0].Name == defaultHostName && cfg.Hosts[0].URI == virt.DefaultURI {
		cfg.Hosts[0].Name = o.HostName
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
