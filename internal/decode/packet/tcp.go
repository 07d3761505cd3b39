package packet

// TCP endpoint states, as Zeek's TCP analyzer names them.
const (
	tcpInactive = iota
	tcpSynSent
	tcpSynAckSent
	tcpPartial
	tcpEstablished
	tcpClosed
	tcpReset
)

const (
	flagFIN = 1 << iota
	flagSYN
	flagRST
	flagPSH
	flagACK
)

// tooLargeSeqDelta is the jump beyond which a SYN's or RST's sequence
// number is not trusted (Zeek's TOO_LARGE_SEQ_DELTA).
const tooLargeSeqDelta = 1048576

// endpoint is one side of a connection. Sequence numbers are kept both as
// the last 32-bit value seen and as a 64-bit offset from the start, so that
// connections beyond 4 GiB count right.
type endpoint struct {
	pkts, ipBytes, udpBytes int64
	state, prev             uint8
	didClose                bool
	fins                    uint32
	start                   uint32
	last32, ack32           uint32
	lastRel, ackRel         int64
}

func (e *endpoint) setState(s uint8) {
	if s != e.state {
		e.prev, e.state = e.state, s
	}
}

func (e *endpoint) initSeq(start, ack, last uint32) {
	e.start = start
	e.ack32, e.ackRel = ack, int64(int32(ack-start))
	e.last32, e.lastRel = last, int64(int32(last-start))
}

func (e *endpoint) moveLast(v uint32) {
	e.lastRel += int64(int32(v - e.last32))
	e.last32 = v
}

func (e *endpoint) moveAck(v uint32) {
	e.ackRel += int64(int32(v - e.ack32))
	e.ack32 = v
}

// size is the payload this endpoint sent, from sequence numbers (Zeek's
// TCP_Endpoint::Size): the highest sequence number sent or acknowledged by
// the peer, less the SYN and FIN octets.
func (e *endpoint) size(peer *endpoint) int64 {
	if e.prev == tcpSynSent && e.state == tcpReset && peer.state == tcpInactive && !(e.ackRel == 0 || e.ackRel == 1) {
		return 0
	}
	s := max(e.lastRel, e.ackRel)
	if s <= 0 {
		return 0
	}
	s--
	if e.fins > 0 && s != 0 {
		s--
	}
	return s
}

// tcpSegment runs one segment through the connection's state, following
// Zeek's TCP analyzer so that byte counts and conn_state agree with it.
// It reports whether the segment closed one side.
func (f *flow) tcpSegment(isOrig bool, flags uint8, seq, ack uint32, plen int, now int64) {
	ep, peer := &f.ep[0], &f.ep[1]
	if !isOrig {
		ep, peer = peer, ep
	}
	segLen := uint32(plen)
	if flags&flagSYN != 0 {
		segLen++
	}
	if flags&flagFIN != 0 {
		segLen++
	}
	if flags&flagRST != 0 {
		segLen -= uint32(plen)
	}
	onePast := seq + segLen

	// init_endpoint
	switch ep.state {
	case tcpInactive:
		if flags&flagSYN != 0 {
			ep.initSeq(seq, seq, onePast)
		} else {
			ep.initSeq(seq-1, seq-1, seq)
		}
	case tcpSynSent, tcpSynAckSent:
		if flags&flagSYN != 0 && seq != ep.start {
			ep.initSeq(seq, seq, onePast)
		}
	case tcpEstablished, tcpPartial:
		if flags&flagSYN != 0 {
			ep.initSeq(seq, seq, onePast)
		}
	case tcpReset:
		if flags&flagSYN != 0 && ep.prev == tcpInactive {
			ep.initSeq(seq, seq, onePast)
		}
	}
	if f.bothClosedAt == 0 {
		f.last = now
	}
	if flags&flagFIN != 0 {
		ep.fins++
	}
	if flags&flagACK != 0 {
		if peer.state == tcpInactive {
			peer.initSeq(ack-1, ack-1, ack-1)
		} else if flags&flagRST == 0 && peer.ackRel+int64(int32(ack-peer.ack32)) >= 0 {
			d := int32(ack - peer.ack32)
			if !(ack == 0 && d > tooLargeSeqDelta) && d > 0 {
				peer.moveAck(ack)
			}
		}
	}
	// update_last_seq
	dl := int32(onePast - ep.last32)
	switch {
	case flags&(flagSYN|flagRST) != 0 && (dl > tooLargeSeqDelta || dl < -tooLargeSeqDelta):
	case flags&flagFIN != 0 && ep.last32 == ep.start+1:
		ep.moveLast(onePast)
	case ep.state == tcpReset:
	case dl > 0:
		ep.moveLast(onePast)
	}

	doClose := false
	switch ep.state {
	case tcpInactive:
		if flags&flagSYN != 0 {
			if isOrig {
				if flags&flagACK != 0 {
					ep.setState(tcpSynAckSent)
				} else {
					ep.setState(tcpSynSent)
					if f.attemptAt == 0 {
						f.attemptAt = now
					}
				}
			} else {
				if flags&flagACK == 0 && peer.state == tcpSynAckSent && seq == ep.start {
					// SYN and SYN-ACK captured in reverse order: the
					// sender of this SYN is the originator.
					f.flip()
					ep, peer = &f.ep[0], &f.ep[1]
					isOrig = true
					peer.setState(tcpEstablished)
				}
				if peer.state == tcpSynSent {
					peer.setState(tcpEstablished)
				}
				ep.setState(tcpEstablished)
			}
		}
		if flags&flagFIN != 0 {
			ep.setState(tcpClosed)
			doClose = true
		}
		if flags&flagRST != 0 {
			ep.setState(tcpReset)
			doClose = true
		}
		if ep.state == tcpInactive {
			switch {
			case !isOrig && plen == 0 && f.ep[0].state == tcpSynSent:
			case flags&flagACK != 0 && peer.state == tcpEstablished:
				ep.setState(tcpEstablished)
			default:
				ep.setState(tcpPartial)
			}
		}
	case tcpSynSent, tcpSynAckSent:
		if flags&flagFIN != 0 {
			ep.setState(tcpClosed)
			doClose = true
		}
		if flags&flagRST != 0 {
			ep.setState(tcpReset)
			doClose = true
		}
	case tcpEstablished, tcpPartial:
		if flags&flagSYN != 0 && ep.state == tcpPartial && peer.state == tcpInactive && flags&flagACK == 0 {
			ep.setState(tcpSynSent)
		}
		if flags&flagFIN != 0 && flags&flagRST == 0 {
			ep.setState(tcpClosed)
			if peer.state == tcpReset && peer.prev == tcpClosed {
				peer.setState(tcpClosed)
			}
			doClose = true
		}
		if flags&flagRST != 0 {
			ep.setState(tcpReset)
			doClose = true
		}
	case tcpClosed:
		if flags&flagRST != 0 && peer.state != tcpClosed {
			ep.setState(tcpReset)
			if !ep.didClose {
				doClose = true
			}
		}
	}
	if doClose && !ep.didClose {
		ep.didClose = true
		if f.ep[0].didClose && f.ep[1].didClose {
			f.bothClosedAt = now
		}
	}
}

// tcpClosing reports whether the connection is over as far as Zeek's
// timers are concerned once it goes quiet: a side closed and either both
// did, or one reset, or the other never spoke.
func (f *flow) tcpClosing() bool {
	o, r := &f.ep[0], &f.ep[1]
	if !o.didClose && !r.didClose {
		return false
	}
	return (o.didClose && r.didClose) || o.state == tcpReset || r.state == tcpReset ||
		o.state == tcpInactive || r.state == tcpInactive
}

// tcpAttempt reports an unanswered connection attempt.
func (f *flow) tcpAttempt() bool {
	o, r := &f.ep[0], &f.ep[1]
	return (o.state == tcpSynSent || o.state == tcpSynAckSent) && r.state == tcpInactive
}

// isReuse reports whether a SYN starts a new connection on this 5-tuple
// (Zeek's TCP IsReuse).
func (f *flow) isReuse(fromOrig bool, flags uint8, seq uint32) bool {
	if flags&flagSYN == 0 {
		return false
	}
	o, r := &f.ep[0], &f.ep[1]
	connOrig := o
	if flags&flagACK != 0 {
		if o.state != tcpInactive {
			return false
		}
		connOrig = r
	}
	closed := (o.didClose && r.didClose) || o.state == tcpReset || r.state == tcpReset
	if closed {
		return true
	}
	if seq == connOrig.start {
		return false
	}
	if flags&flagACK == 0 && connOrig.state == tcpSynAckSent && r.state == tcpInactive && seq == r.start {
		return false
	}
	return true
}

// connState is Zeek's conn_state for a TCP connection.
func (f *flow) tcpConnState() string {
	os, rs := f.ep[0].state, f.ep[1].state
	oInactive := os == tcpInactive || os == tcpPartial
	rInactive := rs == tcpInactive || rs == tcpPartial
	switch {
	case rs == tcpReset:
		if os == tcpSynSent || os == tcpSynAckSent ||
			(os == tcpReset && f.ep[0].size(&f.ep[1]) == 0 && f.ep[1].size(&f.ep[0]) == 0) {
			return "REJ"
		}
		if oInactive {
			return "RSTRH"
		}
		return "RSTR"
	case os == tcpReset:
		if rInactive {
			return "RSTOS0"
		}
		return "RSTO"
	case rs == tcpClosed && os == tcpClosed:
		return "SF"
	case os == tcpClosed:
		if rInactive {
			return "SH"
		}
		return "S2"
	case rs == tcpClosed:
		if oInactive {
			return "SHR"
		}
		return "S3"
	case os == tcpSynSent && rs == tcpInactive:
		return "S0"
	case os == tcpEstablished && rs == tcpEstablished:
		return "S1"
	}
	return "OTH"
}
