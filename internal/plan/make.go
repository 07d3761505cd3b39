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
	if forced != "" {
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
		Overrides:    applied,
	}
	if pl.Runnable {
		pl.Reason = ""
	} else if pl.Reason == "" {
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
	if s.ABI != nil {
		pl.Image.ABI = s.ABI.Name
	}
	records.Init(pl, records.KindPlan, now)
	return pl, nil
}
