package pcapgen

import (
	"net/netip"
)

// Conn is a TCP conversation being written; C is the client, S the server.
type Conn struct {
	g          *Gen
	C, S       netip.AddrPort
	cseq, sseq uint32
	// MSS splits payloads into segments of at most this many bytes.
	MSS int
}

// Dial writes a three-way handshake and returns the established
// conversation.
func (g *Gen) Dial(c, s netip.AddrPort, cisn, sisn uint32) *Conn {
	g.TCP(c, s, cisn, 0, SYN, nil)
	g.TCP(s, c, sisn, cisn+1, SYN|ACK, nil)
	g.TCP(c, s, cisn+1, sisn+1, ACK, nil)
	return &Conn{g: g, C: c, S: s, cseq: cisn + 1, sseq: sisn + 1, MSS: 1460}
}

// Send writes client data, segment by segment, each acknowledged.
func (c *Conn) Send(data []byte) {
	for len(data) > 0 {
		n := min(len(data), c.MSS)
		c.g.TCP(c.C, c.S, c.cseq, c.sseq, PSH|ACK, data[:n])
		c.cseq += uint32(n)
		c.g.TCP(c.S, c.C, c.sseq, c.cseq, ACK, nil)
		data = data[n:]
	}
}

// Reply writes server data, segment by segment, each acknowledged.
func (c *Conn) Reply(data []byte) {
	for len(data) > 0 {
		n := min(len(data), c.MSS)
		c.g.TCP(c.S, c.C, c.sseq, c.cseq, PSH|ACK, data[:n])
		c.sseq += uint32(n)
		c.g.TCP(c.C, c.S, c.cseq, c.sseq, ACK, nil)
		data = data[n:]
	}
}

// Close writes a graceful close started by the client.
func (c *Conn) Close() {
	c.g.TCP(c.C, c.S, c.cseq, c.sseq, FIN|ACK, nil)
	c.g.TCP(c.S, c.C, c.sseq, c.cseq+1, FIN|ACK, nil)
	c.g.TCP(c.C, c.S, c.cseq+1, c.sseq+1, ACK, nil)
}

// Reset writes a client reset.
func (c *Conn) Reset() {
	c.g.TCP(c.C, c.S, c.cseq, c.sseq, RST|ACK, nil)
}

// Refused writes a SYN answered by a RST.
func (g *Gen) Refused(c, s netip.AddrPort, isn uint32) {
	g.TCP(c, s, isn, 0, SYN, nil)
	g.TCP(s, c, 0, isn+1, RST|ACK, nil)
}

// Unanswered writes a SYN and its retransmissions.
func (g *Gen) Unanswered(c, s netip.AddrPort, isn uint32, tries int) {
	for i := 0; i < tries; i++ {
		g.TCP(c, s, isn, 0, SYN, nil)
	}
}

// CloseByServer writes a graceful close started by the server, as an
// HTTP/1.0 server or one that answers once does.
func (c *Conn) CloseByServer() {
	c.g.TCP(c.S, c.C, c.sseq, c.cseq, FIN|ACK, nil)
	c.g.TCP(c.C, c.S, c.cseq, c.sseq+1, FIN|ACK, nil)
	c.g.TCP(c.S, c.C, c.sseq+1, c.cseq+1, ACK, nil)
}

// Retransmit writes the client's last len(data) bytes again, as a client
// that missed their acknowledgement does: no new payload.
func (c *Conn) Retransmit(data []byte) {
	c.g.TCP(c.C, c.S, c.cseq-uint32(len(data)), c.sseq, PSH|ACK, data)
}

// ServerFin writes the server closing its side, which the client
// acknowledges: the connection is half open.
func (c *Conn) ServerFin() {
	c.g.TCP(c.S, c.C, c.sseq, c.cseq, FIN|ACK, nil)
	c.sseq++
	c.g.TCP(c.C, c.S, c.cseq, c.sseq, ACK, nil)
}
