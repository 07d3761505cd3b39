// Package decode is what the decoders under it share: the sink they hand
// what they find to. Each decoder is a package of its own: packet (packets
// into connections, observables and floods), capfile (pcap and pcapng
// files), dns, httpmsg, tlsfp, botproto, and the sensor logs' readers zeek
// and eve.
package decode

import (
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Sink receives what a decoder finds: observables, which the sink owns
// after the call, and connections, which it copies what it keeps of.
type Sink interface {
	Add(o *records.Observable)
	Conn(c *flowlog.Conn)
}
