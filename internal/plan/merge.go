package plan

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Overrides are the layers above a profile: a user file (a partial profile
// in JSON, applied as an RFC 7396 merge patch) and then flags. Zero values
// mean "not given".
type Overrides struct {
	File string

	VCPUs           int
	MemoryMiB       int
	DiskGiB         int
	TTL             time.Duration
	BootTimeout     time.Duration
	Timeout         time.Duration
	Window          time.Duration
	Network         string
	RateLimit       string
	AllowSMTP       *bool
	Promote         *bool
	Instrumentation string
	Detach          *bool
	Cycles          int
	Args            []string
	Env             map[string]string
	Workdir         string
	Images          []string
	// Platform forces the guest platform instead of the triage's choice.
	Platform string
	// Yara adds rule directories to the profile's.
	Yara []string
}

// Resolve merges profile < user file < flags, in that order, and validates
// the result. It returns the merged profile and a label for every layer that
// changed something, for the plan's "overrides" field.
func Resolve(p Profile, o Overrides) (Profile, []string, error) {
	var applied []string
	if o.File != "" {
		patch, err := os.ReadFile(o.File)
		if err != nil {
			return p, nil, fmt.Errorf("overrides file: %w", err)
		}
		merged, err := mergePatch(p, patch)
		if err != nil {
			return p, nil, fmt.Errorf("overrides file %s: %w", o.File, err)
		}
		merged.Name, merged.Version, merged.Source = p.Name, p.Version, p.Source
		p = merged
		applied = append(applied, "file:"+o.File)
	}
	flag := func(name string, v any) { applied = append(applied, fmt.Sprintf("flag:--%s=%v", name, v)) }
	setInt := func(dst *int, v int, name string) {
		if v != 0 {
			*dst = v
			flag(name, v)
		}
	}
	setDur := func(dst *records.Duration, v time.Duration, name string) {
		if v != 0 {
			*dst = records.Duration(v)
			flag(name, v)
		}
	}
	setStr := func(dst *string, v, name string) {
		if v != "" {
			*dst = v
			flag(name, v)
		}
	}
	setBool := func(dst *bool, v *bool, name string) {
		if v != nil {
			*dst = *v
			flag(name, *v)
		}
	}
	setInt(&p.Lease.VCPUs, o.VCPUs, "vcpus")
	setInt(&p.Lease.MemoryMiB, o.MemoryMiB, "memory")
	setInt(&p.Lease.DiskGiB, o.DiskGiB, "disk")
	setDur(&p.Lease.TTL, o.TTL, "ttl")
	setDur(&p.Timeouts.Boot, o.BootTimeout, "boot-timeout")
	setDur(&p.Timeouts.Execution, o.Timeout, "timeout")
	setDur(&p.Timeouts.Window, o.Window, "window")
	setStr(&p.Network.Mode, o.Network, "network")
	setStr(&p.Network.RateLimit, o.RateLimit, "rate-limit")
	setBool(&p.Network.AllowSMTP, o.AllowSMTP, "allow-smtp")
	setBool(&p.Network.Promote, o.Promote, "promote")
	setStr(&p.Instrument, o.Instrumentation, "instrumentation")
	for _, d := range o.Yara {
		if !slices.Contains(p.Yara, d) {
			p.Yara = append(slices.Clip(p.Yara), d)
			flag("yara", d)
		}
	}
	setBool(&p.Execution.Detach, o.Detach, "detach")
	setInt(&p.Execution.Cycles, o.Cycles, "cycles")
	setStr(&p.Execution.Workdir, o.Workdir, "workdir")
	if len(o.Args) > 0 {
		p.Execution.Args = append([]string(nil), o.Args...)
		flag("arg", o.Args)
	}
	if len(o.Env) > 0 {
		env := make(map[string]string, len(p.Execution.Env)+len(o.Env))
		for k, v := range p.Execution.Env {
			env[k] = v
		}
		for k, v := range o.Env {
			env[k] = v
		}
		p.Execution.Env = env
		flag("env", o.Env)
	}
	if len(o.Images) > 0 {
		p.Preferred = append([]string(nil), o.Images...)
		flag("image", o.Images)
	}
	if err := validate(&p); err != nil {
		return p, nil, err
	}
	return p, applied, nil
}

// mergePatch applies an RFC 7396 JSON merge patch to a profile: objects
// merge key by key, anything else (arrays included) replaces, null deletes.
func mergePatch(p Profile, patch []byte) (Profile, error) {
	var patchDoc any
	if err := json.Unmarshal(patch, &patchDoc); err != nil {
		return p, err
	}
	if _, ok := patchDoc.(map[string]any); !ok {
		return p, fmt.Errorf("must be a JSON object")
	}
	base, err := json.Marshal(p)
	if err != nil {
		return p, err
	}
	var doc any
	if err := json.Unmarshal(base, &doc); err != nil {
		return p, err
	}
	merged, err := json.Marshal(applyPatch(doc, patchDoc))
	if err != nil {
		return p, err
	}
	var out Profile
	if err := strictDecode(merged, &out); err != nil {
		return p, err
	}
	return out, nil
}

func applyPatch(target, patch any) any {
	pm, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	tm, ok := target.(map[string]any)
	if !ok {
		tm = map[string]any{}
	}
	for k, v := range pm {
		if v == nil {
			delete(tm, k)
			continue
		}
		tm[k] = applyPatch(tm[k], v)
	}
	return tm
}
