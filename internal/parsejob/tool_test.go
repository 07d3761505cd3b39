package parsejob

import (
	"context"
	"io"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// tbParse does what "tb-parse" does with req in the state directory root:
// stdin read from in, records printed to out, warnings to errb.
func tbParse(root string, in io.Reader, req Request, out, errb io.Writer) error {
	ctx := context.Background()
	sink := cmdout.New("tb-parse", out, errb, nil)
	job, err := Prepare(req, in, sink.Warnf)
	if err != nil {
		return err
	}
	var st *state.Store
	if job.NeedsState() {
		if st, err = state.Open(ctx, root, state.WithDurability(state.SyncOnFlush)); err != nil {
			return err
		}
		defer st.Close()
	}
	return job.Run(ctx, st, sink)
}

// tbFlows does what "tb-parse flows" does in the state directory root.
func tbFlows(root string, req FlowsRequest, out, errb io.Writer) error {
	ctx := context.Background()
	st, err := state.Open(ctx, root)
	if err != nil {
		return err
	}
	defer st.Close()
	return Flows(ctx, st, req, cmdout.New("tb-parse", out, errb, nil))
}
