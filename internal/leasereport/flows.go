package leasereport

import (
	"fmt"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
)

// readLog adds one flow log's connections to t.
func (c *collector) readLog(fr *flowlog.Reader, j flowJob, t *tally) error {
	if err := c.st.EnsureBlob(c.ctx, j.art.SHA256); err != nil {
		return fmt.Errorf("flow log %s: %w", j.art.ID, err)
	}
	f, err := c.st.OpenBlob(j.art.SHA256)
	if err != nil {
		return fmt.Errorf("flow log %s: %w", j.art.ID, err)
	}
	defer f.Close()
	var key []byte
	err = fr.Each(f, func(n int64, rec *flowlog.Record) error {
		if n&0xfff == 0 && c.ctx.Err() != nil {
			return c.ctx.Err()
		}
		key = endpoint.Append(key[:0], rec.RespH, rec.RespP, rec.Proto)
		c.tallyConn(t, rec, j.lease, j.scans, key)
		return nil
	})
	if err != nil {
		return fmt.Errorf("flow log %s: %w", j.art.ID, err)
	}
	return nil
}

// tallyConn adds one connection of lease to t: to its hour, and to the
// check-ins of the C2 it went to (key is its endpoint) or to the scan it
// belongs to.
func (c *collector) tallyConn(t *tally, rec *flowlog.Record, lease string, scans []scanKey, key []byte) {
	h := t.hour(rec.TS)
	h.conns++
	if rec.Established() {
		h.est++
	}
	if c.isC2[string(key)] {
		v := string(key)
		t.checkIn(v, rec.TS, c.forwarded(lease, v, time.Unix(0, rec.TS)))
		t.c2[v].keepFirst(rec.TS, rec.UID)
		return
	}
	for _, s := range scans {
		if s.proto == string(rec.Proto) && (s.port != 0 && s.port == rec.RespP || s.addr != "" && s.addr == string(rec.RespH)) {
			t.scan(s.target, rec.TS, 1)
			return
		}
	}
}
