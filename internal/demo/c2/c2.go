// Package c2 is the fake command-and-control server of Talkbox's demo and
// end-to-end test. It speaks the C2's side of the beacon's bot protocols
// (internal/demo/beacon/botwire): over HTTP (Handler) it answers each
// check-in with a task, which the beacon reports done on the same
// connection; in a Mirai, Gafgyt or IRC session (Server) it takes the
// bot's registration and keeps the session alive. Given an attack order,
// it sends it once to each bot (HTTP) or session. It logs every check-in,
// registration, keep-alive and order sent as a JSON line, which is what
// the tests assert on.
package c2

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon/botwire"
)

// Hit is one logged line: an HTTP check-in, a session's registration
// (Seq 0) or keep-alive, an order sent (Order, with Time and Remote only)
// or a session's protocol error.
type Hit struct {
	Time      time.Time `json:"time"`
	Remote    string    `json:"remote"`
	Method    string    `json:"method,omitempty"`
	Host      string    `json:"host,omitempty"`
	Path      string    `json:"path,omitempty"`
	UserAgent string    `json:"user_agent,omitempty"`
	// Proto is a session's protocol (botwire), "" for HTTP.
	Proto string `json:"proto,omitempty"`
	// Bot, Seq and Attempt come from the beacon's JSON body; in a session,
	// Bot is the ID it registered with and Seq counts its keep-alives.
	Bot     string `json:"bot,omitempty"`
	Seq     int    `json:"seq,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	Order   string `json:"order,omitempty"`
	// Error is why a session ended other than by the bot leaving.
	Error string `json:"error,omitempty"`
}

// hitLog writes Hits as JSON lines, one writer at a time.
type hitLog struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
}

func (l *hitLog) write(h Hit) {
	line, _ := json.Marshal(h)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w.Write(append(line, '\n'))
}

// sent logs an order sent to remote.
func (l *hitLog) sent(remote string, o botwire.Order) {
	l.write(Hit{Time: l.now().UTC(), Remote: remote, Order: o.String()})
}

// ServerName is sent in the Server header, so that the beacon's log tells
// the real C2 from the sinkhole's fake web server.
const ServerName = "talkbox-demo-c2"

// Handler logs every check-in to log as a JSON line and answers with a
// task: "sleep", or its order the first time a bot checks in. The
// beacon's report of the task, on the same connection, is answered and
// not logged.
type Handler struct {
	log   hitLog
	order *botwire.Order
	mu    sync.Mutex
	// ordered are the bots sent the order, at most maxOrdered.
	ordered map[string]bool
}

// maxOrdered bounds the bots the handler remembers ordering: past it, no
// more orders are sent, so that bots inventing IDs cannot grow the map.
const maxOrdered = 4096

// NewHandler logs to w and orders nothing.
func NewHandler(w io.Writer) *Handler { return NewOrderHandler(w, nil) }

// NewOrderHandler logs to w and sends order (nil: none) to each bot once.
func NewOrderHandler(w io.Writer, order *botwire.Order) *Handler {
	return &Handler{log: hitLog{w: w, now: time.Now}, order: order, ordered: map[string]bool{}}
}

// orderFor is the order for a bot's check-in, nil when it had it already.
func (h *Handler) orderFor(bot string) *botwire.Order {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.order == nil || bot == "" || h.ordered[bot] || len(h.ordered) >= maxOrdered {
		return nil
	}
	h.ordered[bot] = true
	return h.order
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hit := Hit{Time: h.log.now().UTC(), Method: r.Method, Host: r.Host, Path: r.URL.Path, UserAgent: r.UserAgent()}
	hit.Remote, _, _ = net.SplitHostPort(r.RemoteAddr)
	var body struct {
		ID      string `json:"id"`
		Seq     int    `json:"seq"`
		Attempt int    `json:"attempt"`
		Done    string `json:"done"`
	}
	w.Header().Set("Server", ServerName)
	w.Header().Set("Content-Type", "application/json")
	if json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&body) == nil {
		if body.Done != "" {
			// The beacon's report of the task on the same connection: not
			// a check-in.
			io.WriteString(w, `{"ok":true}`+"\n")
			return
		}
		hit.Bot, hit.Seq, hit.Attempt = body.ID, body.Seq, body.Attempt
	}
	h.log.write(hit)
	if o := h.orderFor(hit.Bot); o != nil {
		task, _ := json.Marshal(struct {
			Task string `json:"task"`
		}{o.String()})
		io.WriteString(w, string(task)+"\n")
		h.log.sent(hit.Remote, *o)
		return
	}
	io.WriteString(w, `{"task":"sleep"}`+"\n")
}

// ReadHits decodes a log written by Handler.
func ReadHits(r io.Reader) ([]Hit, error) {
	var out []Hit
	dec := json.NewDecoder(r)
	for {
		var h Hit
		err := dec.Decode(&h)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, h)
	}
}
