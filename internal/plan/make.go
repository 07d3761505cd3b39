package plan

import (
	"fmt"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/platform"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Make builds the plan for one sample from a resolved profile. forced, when
// set, is the platform a flag imposed instead of the triage's choice.
func Make(s *records.Sample, p Profile, applied []string, forced string, now time.Time) (*records.Plan, error) {
	m := platform.For(s.Triage)
	// Forcing the platform the emulator runs in keeps the emulation: the
	// sample still needs its qemu-user target in that guest.
	if forced != "" && (m.User == nil || forced != m.Platform.Name) {
		fp, ok := platform.Lookup(forced)
		if !ok {
			return nil, fmt.Errorf("unknown platform %q", forced)
		}
		m = platform.Match{Platform: fp, Found: true, Features: m.Features}
		if !fp.Images {
			m.Reason = fmt.Sprintf("needs a %s guest: %s", fp.Name, fp.Why)
		}
	}
	pl := &records.Plan{
		Sample:       s.ID,
		SampleSHA256: s.SHA256,
		Profile:      records.ProfileRef{Name: p.Name, Version: p.Version},
		Runnable:     m.Runnable(),
		Reason:       m.Reason,
		Lease:        p.Lease,
		Network:      p.Network,
		Execution:    p.Execution,
		Timeouts:     p.Timeouts,
		Instrument:   p.Instrument,
		Yara:         p.Yara,
		Overrides:    applied,
	}
	switch {
	case pl.Runnable && m.User != nil:
		// Analysts must see that the sample ran under an emulator, and why.
		pl.Reason = fmt.Sprintf("user-mode emulated: static %s binary runs under %s via binfmt_misc in the %s guest (native: %s)",
			m.User.Platform, m.User.Emulator(), m.Platform.Name, m.Native)
		pl.Emulation = &records.Emulation{Mode: "user", Target: m.User.Name, Emulator: m.User.Emulator(), Platform: m.User.Platform}
	case pl.Runnable:
		pl.Reason = ""
	case pl.Reason == "":
		pl.Reason = "no image can run this sample"
	}
	pl.Image = records.ImageNeeds{
		OS:        "linux",
		Features:  m.Features,
		Preferred: p.Preferred,
	}
	if m.Found {
		pl.Image.Platform = m.Platform.Name
		pl.Image.Arch = m.Platform.Arch
		pl.Image.Bits = m.Platform.Bits
		pl.Image.Endianness = m.Platform.Endianness
	}
	// The ABI is the userland an image must match; an emulated sample
	// brings none into the guest, whose own ABI does not matter to it.
	if s.ABI != nil && pl.Emulation == nil {
		pl.Image.ABI = s.ABI.Name
	}
	records.Init(pl, records.KindPlan, now)
	return pl, nil
}
