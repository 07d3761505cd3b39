package plan

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

//go:embed profiles/*.json
var embedded embed.FS

// Profile is a named, versioned recipe for plans.
type Profile struct {
	Name        string             `json:"name"`
	Version     string             `json:"version"`
	Description string             `json:"description,omitempty"`
	Lease       records.LeaseNeeds `json:"lease"`
	Timeouts    records.Timeouts   `json:"timeouts"`
	Network     records.NetPolicy  `json:"network"`
	Instrument  string             `json:"instrumentation"`
	Execution   records.Execution  `json:"execution"`
	Preferred   []string           `json:"preferred_images,omitempty"`
	// Yara are rule directories (records.Plan.Yara).
	Yara []string `json:"yara,omitempty"`
	// Source is where the profile came from: "embedded" or a file path.
	Source string `json:"source"`
}

var profileName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// Profiles is the set of available profiles: the embedded defaults, shadowed
// by files of the same name in the user directory.
type Profiles struct {
	byName map[string]Profile
}

// LoadProfiles reads the embedded profiles and then every *.json in dir (which
// may be absent). A user file named like an embedded profile replaces it.
func LoadProfiles(dir string) (*Profiles, error) {
	ps := &Profiles{byName: make(map[string]Profile)}
	ents, _ := fs.ReadDir(embedded, "profiles")
	for _, e := range ents {
		b, err := embedded.ReadFile("profiles/" + e.Name())
		if err != nil {
			return nil, err
		}
		if err := ps.add(b, "embedded"); err != nil {
			return nil, fmt.Errorf("embedded profile %s: %w", e.Name(), err)
		}
	}
	if dir == "" {
		return ps, nil
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := ps.add(b, f); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return ps, nil
}

func (ps *Profiles) add(b []byte, source string) error {
	var base Profile
	if err := strictDecode(b, &base); err != nil {
		return err
	}
	if !profileName.MatchString(base.Name) {
		return fmt.Errorf("profile name %q must be lower-case letters, digits, '.', '_' or '-'", base.Name)
	}
	if base.Version == "" {
		return fmt.Errorf("profile %q has no version", base.Name)
	}
	base.Source = source
	if err := validate(&base); err != nil {
		return fmt.Errorf("profile %q: %w", base.Name, err)
	}
	ps.byName[base.Name] = base
	return nil
}

// Get returns a profile by name.
func (ps *Profiles) Get(name string) (Profile, error) {
	p, ok := ps.byName[name]
	if !ok {
		return Profile{}, fmt.Errorf("unknown profile %q (have: %s)", name, strings.Join(ps.Names(), ", "))
	}
	return p, nil
}

// Names lists the profiles in name order.
func (ps *Profiles) Names() []string {
	return slices.Sorted(maps.Keys(ps.byName))
}

// strictDecode rejects unknown keys so a typo in a profile is an error, not a
// silently ignored setting.
func strictDecode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// validate checks a profile after every layer has been merged.
func validate(p *Profile) error {
	switch {
	case p.Lease.VCPUs < 1 || p.Lease.VCPUs > 64:
		return fmt.Errorf("lease.vcpus %d out of range 1..64", p.Lease.VCPUs)
	case p.Lease.MemoryMiB < 64 || p.Lease.MemoryMiB > 1<<20:
		return fmt.Errorf("lease.memory_mib %d out of range 64..1048576", p.Lease.MemoryMiB)
	case p.Lease.DiskGiB < 1 || p.Lease.DiskGiB > 4096:
		return fmt.Errorf("lease.disk_gib %d out of range 1..4096", p.Lease.DiskGiB)
	case p.Lease.TTL <= 0:
		return fmt.Errorf("lease.ttl must be positive")
	case p.Timeouts.Execution < 0 || p.Timeouts.Window < 0 || p.Timeouts.Boot <= 0:
		return fmt.Errorf("timeouts must not be negative (boot must be positive)")
	case p.Network.Mode != "sinkhole" && p.Network.Mode != "allowlist":
		return fmt.Errorf("network.mode %q must be sinkhole or allowlist", p.Network.Mode)
	case p.Execution.Cycles < 1:
		return fmt.Errorf("execution.cycles must be at least 1")
	}
	for _, in := range strings.Split(p.Instrument, "+") {
		if !slices.Contains(records.Instruments, in) {
			return fmt.Errorf("instrumentation %q: %q is not one of %s", p.Instrument, in, strings.Join(records.Instruments, ", "))
		}
	}
	return nil
}
