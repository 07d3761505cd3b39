package records

import (
	"slices"
	"time"
)

// KindWorker is a "tb-run worker" process: its heartbeat.
const KindWorker = "worker"

// Worker is one "tb-run worker" on one host of a fleet. It rewrites this
// record every heartbeat; a worker whose record has not changed for the
// fleet's dead-after is taken for dead with its host, and the cycles its
// host was running are replaced on other hosts.
type Worker struct {
	Meta
	// Host is the fleet host the worker runs cycles on: the name its
	// leases carry (tb-lease's host), unique in the fleet.
	Host string `json:"host"`
	PID  int    `json:"pid"`
	Lab  string `json:"lab,omitempty"`
	// Slots is how many cycles the worker drives at once: its host's
	// capacity, which placement reads; Running the cycles it drives now.
	Slots   int      `json:"slots"`
	Running []string `json:"running,omitempty"`
	// Heartbeat is when the worker last said it was alive; DeadAfter how
	// long the fleet waits past it before taking the worker for dead.
	Heartbeat time.Time `json:"heartbeat"`
	DeadAfter Duration  `json:"dead_after"`
	// BlobURL is where the worker serves its host's blobs to the other
	// hosts (tb-run worker --serve-blobs), if it does.
	BlobURL string `json:"blob_url,omitempty"`
	// Platforms are the guest platforms (Debian architectures) the host
	// can lease now: an active image of each has its files on this host.
	// Native are those of them its host runs under KVM. A cycle that needs
	// a lease goes only to a worker whose Platforms have its plan's
	// platform, one whose Native has it first.
	Platforms []string `json:"platforms,omitempty"`
	Native    []string `json:"native,omitempty"`
	// Stopped is set when the worker ended cleanly.
	Stopped bool `json:"stopped,omitempty"`
}

// Free is how many more cycles the worker would take.
func (w *Worker) Free() int { return max(0, w.Slots-len(w.Running)) }

// Boots tells whether the worker's host can lease a guest of the
// platform ("": of any platform, as tb-lease then takes any image).
func (w *Worker) Boots(platform string) bool {
	if platform == "" {
		return len(w.Platforms) > 0
	}
	return slices.Contains(w.Platforms, platform)
}

// RunsNative tells whether the worker's host runs the platform's guests
// under KVM.
func (w *Worker) RunsNative(platform string) bool {
	return platform != "" && slices.Contains(w.Native, platform)
}

// Alive tells whether the worker's heartbeat is recent at now.
func (w *Worker) Alive(now time.Time) bool {
	return !w.Stopped && now.Sub(w.Heartbeat) <= time.Duration(w.DeadAfter)
}

// IndexKeys: workers are found by host.
func (w *Worker) IndexKeys() []IndexKey { return keysOf(KeyHost, w.Host) }
