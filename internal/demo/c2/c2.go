// Package c2 is the fake command-and-control server of Talkbox's demo and
// end-to-end test: it answers the beacon's check-ins with a task and logs
// each one as a JSON line, which is what the test asserts on; the beacon
// reports the task done on the same connection.
package c2

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Hit is one logged request.
type Hit struct {
	Time      time.Time `json:"time"`
	Remote    string    `json:"remote"`
	Method    string    `json:"method"`
	Host      string    `json:"host"`
	Path      string    `json:"path"`
	UserAgent string    `json:"user_agent,omitempty"`
	// Bot, Seq and Attempt come from the beacon's JSON body.
	Bot     string `json:"bot,omitempty"`
	Seq     int    `json:"seq,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
}

// ServerName is sent in the Server header, so that the beacon's log tells
// the real C2 from the sinkhole's fake web server.
const ServerName = "talkbox-demo-c2"

// Handler logs every check-in to log as a JSON line and answers with a
// task; the beacon's report of the task, on the same connection, is
// answered and not logged.
type Handler struct {
	mu  sync.Mutex
	log io.Writer
	now func() time.Time
}

// NewHandler logs to w.
func NewHandler(w io.Writer) *Handler { return &Handler{log: w, now: time.Now} }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hit := Hit{Time: h.now().UTC(), Method: r.Method, Host: r.Host, Path: r.URL.Path, UserAgent: r.UserAgent()}
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
	line, _ := json.Marshal(hit)
	h.mu.Lock()
	h.log.Write(append(line, '\n'))
	h.mu.Unlock()
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
