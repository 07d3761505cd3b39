package parsejob

import (
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
	}
}

// close hands over what is left and waits until the sink has taken
// everything.
func (h *handover) close() {
	if len(h.batch) > 0 {
		h.full <- h.batch
	}
	close(h.full)
	<-h.done
}
