package plan

import (
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/yarascan"
)

// scan runs the analyst's YARA rules (if any) over a stored sample, stores
// a yara observable per matching rule and prints it after the sample's
// records. A scan that fails is reported for that input; the plan stands.
func (p *planner) scan(smp *records.Sample) {
	if p.yara == nil {
		return
	}
	st := p.ing.Store
	ms, err := p.yara.Scan(p.ctx, st.BlobPath(smp.SHA256))
	if err != nil {
		p.fail(fmt.Errorf("%s: %w", smp.Source, err))
		return
	}
	if len(ms) == 0 {
		return
	}
	f := yarascan.File{Target: yarascan.TargetSample, SHA256: smp.SHA256, Sample: smp.ID, Input: smp.Source}
	if d := p.ing.DroppedBy; d != nil {
		// Found in a cycle: the lease's observable, which its analysis
		// and report read by the cycle.
		f.Target, f.Lease, f.Cycle, f.Input = yarascan.TargetDropped, d.Lease, d.Cycle, d.Path
	}
	obs, err := yarascan.Record(p.ctx, st, f, ms)
	if err != nil {
		p.fail(fmt.Errorf("%s: %w", smp.Source, err))
	}
	for _, o := range obs {
		p.log.Info("yara rule matches the sample", "sample", smp.ID, "rule", o.Value)
		line, err := records.Marshal(o)
		if err != nil {
			p.fail(err)
			return
		}
		p.out.Write(line)
		p.out.WriteByte('\n')
	}
}
