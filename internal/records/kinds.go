package records

// New returns an empty typed record for a kind, or a Generic one for kinds
// this build does not model (Generic keeps every field, so such records
// still pass through the tools unchanged).
func New(kind string) Record {
	switch kind {
	case KindSample:
		return &Sample{}
	case KindPlan:
		return &Plan{}
	case KindImage:
		return &SandboxImage{}
	case KindBuild:
		return &ImageBuildRun{}
	case KindCapture:
		return &Capture{}
	case KindArtifact:
		return &Artifact{}
	case KindObservable:
		return &Observable{}
	case KindLease:
		return &SandboxLease{}
	case KindSnapshot:
		return &LeaseSnapshot{}
	case KindAllow:
		return &AllowEntry{}
	case KindRevision:
		return &AllowRevision{}
	case KindCycle:
		return &Cycle{}
	case KindExecution:
		return &ExecutionSnapshot{}
	case KindAnalysis:
		return &RunAnalysis{}
	case KindEvent:
		return &Event{}
	case KindWorker:
		return &Worker{}
	}
	return &Generic{}
}
