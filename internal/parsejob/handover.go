package parsejob

import (
	"fmt"
	"runtime/debug"
	"sync/atomic"

	"github.com/talkbox-sandbox/talkbox/internal/decode"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// handoverBatch is how many findings the decoder hands over at a time: a
// channel send per finding would cost more than most findings' own work.
const handoverBatch = 256

// handover is the sink a capture's decoder writes to: it passes what the
// decoder finds to the input's sink on a second goroutine, in batches, so
// that with a second core the folding of observables into the set and of
// connections into the destinations and the flow log (a third of the
// parse) runs beside the decoding. The order of the findings is kept. The
// decoder reuses its Conn, so a connection is copied; an observable is the
// decoder's no more once added (it keeps no pointer to one).
type handover struct {
	batch []finding
	full  chan []finding
	empty chan []finding
	done  chan struct{}
	// failed is the sink's panic, once it has panicked.
	failed atomic.Pointer[goroutinePanic]
}

// finding is an observable, or (obs nil) a connection.
type finding struct {
	obs  *records.Observable
	conn flowlog.Conn
}

// startHandover starts the goroutine that passes findings to sink; nothing
// else may use sink until close returns.
func startHandover(sink decode.Sink) *handover {
	h := &handover{full: make(chan []finding, 2), empty: make(chan []finding, 3), done: make(chan struct{})}
	for range 3 {
		h.empty <- make([]finding, 0, handoverBatch)
	}
	h.batch = <-h.empty
	go func() {
		defer close(h.done)
		defer func() {
			if r := recover(); r != nil {
				// The sink's bug: the decoder's goroutine panics with it
				// at its next hand-over, where the tool's own recovery
				// reports it. Until then the findings are taken and
				// dropped, so that it does not wait for room.
				h.failed.Store(&goroutinePanic{value: r, stack: debug.Stack()})
				for b := range h.full {
					h.empty <- b[:0]
				}
			}
		}()
		for b := range h.full {
			for i := range b {
				if f := &b[i]; f.obs != nil {
					sink.Add(f.obs)
				} else {
					sink.Conn(&f.conn)
				}
				b[i] = finding{} // the observable is the sink's now
			}
			h.empty <- b[:0]
		}
	}()
	return h
}

func (h *handover) Add(o *records.Observable) {
	h.batch = append(h.batch, finding{obs: o})
	h.send()
}

func (h *handover) Conn(c *flowlog.Conn) {
	h.batch = append(h.batch, finding{conn: *c})
	h.send()
}

func (h *handover) send() {
	if len(h.batch) == handoverBatch {
		h.full <- h.batch
		h.batch = <-h.empty
		h.check()
	}
}

// check panics, on the decoder's goroutine, with the sink's panic.
func (h *handover) check() {
	if p := h.failed.Load(); p != nil {
		panic(p)
	}
}

// goroutinePanic is a panic of another goroutine of the run (the sink's, a
// batch's), raised again on the run's own with where it happened.
type goroutinePanic struct {
	value any
	stack []byte
}

func (p *goroutinePanic) String() string { return fmt.Sprint(p.value) }

// PanicStack is the stack of the goroutine that panicked, which
// the tool's recovery logs (cli.Run).
func (p *goroutinePanic) PanicStack() []byte { return p.stack }

// close hands over what is left and waits until the sink has taken
// everything.
func (h *handover) close() {
	if len(h.batch) > 0 {
		h.full <- h.batch
	}
	close(h.full)
	<-h.done
	h.check()
}
