package flowlog

import "net/netip"

// Conn is one connection as Zeek's conn.log describes it: the decoders
// hand every connection to their sink, which writes it to the flow log and
// folds it into the cycle's destinations. A decoder may reuse a Conn after
// the call returns.
type Conn struct {
	// UID names the connection in the flow log and in the provenance of
	// what was seen on it: the decoder gives it (UIDs), or takes the
	// sensor's own (Zeek's uid, Suricata's flow_id). Empty, it is UIDs'
	// UIDSeq-th, not made into a string until something keeps it (an
	// observable's provenance): most of a scan's connections are only
	// written (AppendUID).
	UID    string
	UIDs   *UIDs
	UIDSeq int64
	// Start and End are capture times in Unix nanoseconds.
	Start, End int64
	Proto      string // tcp, udp, icmp, or the IP protocol number
	OrigH      netip.Addr
	OrigP      uint16
	RespH      netip.Addr
	RespP      uint16
	// Service is what was recognised in the payload: dns, http, ssl.
	Service   string
	ConnState string // Zeek's conn_state
	History   string // Zeek's history letters ("" when unknown)
	// Byte counts follow Zeek's conn.log: payload bytes from sequence
	// numbers (TCP) or datagram lengths, and IP-level bytes.
	OrigPkts, OrigBytes, OrigIPBytes int64
	RespPkts, RespBytes, RespIPBytes int64
	// Packet or Line is where it was first seen in its input.
	Packet, Line int64
	// Exchange is how far the responder answered as a server of the
	// originator's protocol would (Exchange*): the packet decoder reads it
	// from the payloads; logs that do not tell (Zeek, EVE) leave it 0.
	Exchange uint8
	// Resumed: the connection was carried from the previous capture of its
	// stream (the decoder's Seed), so it began there: no new contact.
	Resumed bool
}

// How far a connection's responder answered, each level implying those
// before it: the allow-list's probation confirms an endpoint only on
// ExchangeConversed, since any server sends something back.
const (
	ExchangeNone     = iota // no payload from the responder, or not known
	ExchangeAnswered        // payload, but not in the originator's protocol
	ExchangeProtocol        // its first payload in the originator's protocol
	// ExchangeConversed: and the originator sent new payload after it,
	// while the responder still held the session open.
	ExchangeConversed
)

// Accepted reports whether the destination accepted the connection: a TCP
// handshake it answered (or data it sent), a UDP or other reply.
func (c *Conn) Accepted() bool {
	if c.Proto != "tcp" {
		return c.RespPkts > 0
	}
	switch c.ConnState {
	case "S1", "S2", "S3", "SF", "RSTO", "RSTR", "SHR":
		return true
	}
	return c.RespBytes > 0
}

// Rejected reports whether the destination refused a TCP connection.
func (c *Conn) Rejected() bool { return c.Proto == "tcp" && c.ConnState == "REJ" }

// Established reports whether the connection counts as established for the
// allow-list's evidence: a completed TCP handshake, a UDP answer.
func (c *Conn) Established() bool {
	if c.Proto != "tcp" {
		return c.RespPkts > 0
	}
	switch c.ConnState {
	case "S1", "S2", "S3", "SF", "SHR":
		return true
	}
	return false
}

// AppendUID appends the connection's uid.
func (c *Conn) AppendUID(b []byte) []byte {
	if c.UID == "" && c.UIDs != nil {
		return c.UIDs.AppendAt(b, c.UIDSeq)
	}
	return append(b, c.UID...)
}
