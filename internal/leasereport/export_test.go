package leasereport

// The timeline's colours, for the browser test to find the timeline in a
// screenshot by.
var (
	OutcomeColour = outcomeColour
	HealthColour  = healthColour
	CauseColour   = causeColour
	Answered      = answeredColour
	Sinkholed     = sinkholedColour
)
