package firewall

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// A change of a lease's allow set goes over one netfilter socket of our
// own, opened on a thread already in the lab's namespace: its queries
// and its batch share it (a set dump has a socket of its own), the
// elements are encoded straight into the messages, and set dumps are
// decoded in place. google/nftables opens a socket (and enters the
// namespace) per query and builds each element from attribute values,
// which for 100,000 elements took as long as the kernel's own work.
type wire struct {
	c *netlink.Conn
}

// inNS runs fn in the lab's namespace with a socket opened there (with
// buffers for a batch of 100,000 elements if big); the namespace's own
// interfaces are what fn sees through net.
func (f *NFT) inNS(big bool, fn func(w *wire) error) error {
	return netns.Do(f.cfg.NetNS, func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return fmt.Errorf("nftables: %w", err)
		}
		defer c.Close()
		if big {
			if err := bigBuffers(c); err != nil {
				return err
			}
		}
		return fn(&wire{c: c})
	})
}

// nfgen is the nfgenmsg header of a message for one table family.
func nfgen(family byte) []byte { return []byte{family, unix.NFNETLINK_V0, 0, 0} }

// attr appends one attribute, padded to four bytes.
func attr(b []byte, typ uint16, val []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(val)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func cstr(s string) []byte { return append([]byte(s), 0) }

// tableSet is the start of a message about one set: its table and name.
func tableSet(family byte, table, set string) []byte {
	b := nfgen(family)
	b = attr(b, unix.NFTA_SET_ELEM_LIST_TABLE, cstr(table))
	return attr(b, unix.NFTA_SET_ELEM_LIST_SET, cstr(set))
}

// setsExist asks for sets by name, all in one message round: a set or
// an error answers each request, in order.
func (w *wire) setsExist(sets ...*nftables.Set) ([]bool, error) {
	msgs := make([]netlink.Message, len(sets))
	for i, s := range sets {
		b := nfgen(byte(s.Table.Family))
		b = attr(b, unix.NFTA_SET_TABLE, cstr(s.Table.Name))
		b = attr(b, unix.NFTA_SET_NAME, cstr(s.Name))
		// No acknowledgement asked: the set or an error is the answer.
		msgs[i] = netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSET), Flags: netlink.Request},
			Data:   b,
		}
	}
	sent, err := w.c.SendMessages(msgs)
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(sets))
	for answered := 0; answered < len(sets); {
		replies, err := w.c.Receive()
		if errors.Is(err, unix.ENOENT) {
			answered++ // the answer to the next request is its absence
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, r := range replies {
			for i, m := range sent {
				if r.Header.Sequence == m.Header.Sequence {
					out[i] = true
					answered++
				}
			}
		}
	}
	return out, nil
}

// attrs walks the attributes in b, calling fn with each one's type
// (flags stripped) and value; it stops at the first that does not fit.
func attrs(b []byte, fn func(typ uint16, val []byte)) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:4])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[4:l])
		b = b[min((l+3)&^3, len(b)):]
	}
}

// setKeys dumps the keys of a set's elements, keyLen bytes apiece in one
// buffer. With limit > 0 it gives up (complete false) once it has more
// than limit: the kernel restarts a set's dump from the start for each
// message it fills, so that reading n elements costs it O(n²). The dump
// goes over a socket of its own, which an abandoned dump leaves busy.
func (w *wire) setKeys(family byte, table, set string, keyLen, limit int) (keys []byte, complete bool, err error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, false, err
	}
	defer c.Close()
	req, err := c.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM), Flags: netlink.Request | netlink.Dump},
		Data:   tableSet(family, table, set),
	})
	if err != nil {
		return nil, false, err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, false, err
	}
	buf := make([]byte, 64<<10)
	for limit <= 0 || len(keys) <= limit*keyLen {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN
		}); err != nil {
			return nil, false, err
		}
		if rerr != nil {
			return nil, false, rerr
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, false, err
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Header.Sequence {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return keys, true, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
						return nil, false, syscall.Errno(-code)
					}
				}
				continue
			}
			if len(m.Data) < 4 {
				continue
			}
			attrs(m.Data[4:], func(typ uint16, v []byte) {
				if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
					return
				}
				attrs(v, func(typ uint16, v []byte) {
					if typ != unix.NFTA_LIST_ELEM {
						return
					}
					attrs(v, func(typ uint16, v []byte) {
						if typ != unix.NFTA_SET_ELEM_KEY {
							return
						}
						attrs(v, func(typ uint16, v []byte) {
							if typ == unix.NFTA_DATA_VALUE && len(v) >= keyLen {
								keys = append(keys, v[:keyLen]...)
							}
						})
					})
				})
			})
		}
	}
	return keys, false, nil
}

// ruleLabels lists the comments of a chain's rules.
func (w *wire) ruleLabels(family byte, table, chain string) ([]string, error) {
	b := nfgen(family)
	b = attr(b, unix.NFTA_RULE_TABLE, cstr(table))
	b = attr(b, unix.NFTA_RULE_CHAIN, cstr(chain))
	msgs, err := w.c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE), Flags: netlink.Request | netlink.Dump},
		Data:   b,
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		attrs(m.Data[4:], func(typ uint16, v []byte) {
			if typ == unix.NFTA_RULE_USERDATA {
				out = append(out, label(v))
			}
		})
	}
	return out, nil
}

// maxPerMsg is the most elements one message carries: the element list is
// one attribute, whose length is 16 bits (24 bytes an element).
const maxPerMsg = 2048

// elemMsgs appends the messages that apply op (NEWSETELEM, DELSETELEM,
// DESTROYSETELEM) to every key of keys (keyLen bytes each) in one set.
func elemMsgs(msgs []netlink.Message, op uint16, family byte, table, set string, keys []byte, keyLen int) []netlink.Message {
	flags := netlink.Request | netlink.Acknowledge
	if op == unix.NFT_MSG_NEWSETELEM {
		flags |= netlink.Create
	}
	head := tableSet(family, table, set)
	per := 12 + keyLen
	for len(keys) > 0 {
		n := min(len(keys)/keyLen, maxPerMsg)
		b := make([]byte, len(head), len(head)+4+n*per)
		copy(b, head)
		b = binary.NativeEndian.AppendUint16(b, uint16(4+n*per))
		b = binary.NativeEndian.AppendUint16(b, unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		for i := 0; i < n; i++ {
			b = binary.NativeEndian.AppendUint16(b, uint16(per))
			b = binary.NativeEndian.AppendUint16(b, unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM)
			b = binary.NativeEndian.AppendUint16(b, uint16(per-4))
			b = binary.NativeEndian.AppendUint16(b, unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_KEY)
			b = binary.NativeEndian.AppendUint16(b, uint16(4+keyLen))
			b = binary.NativeEndian.AppendUint16(b, unix.NFTA_DATA_VALUE)
			b = append(b, keys[i*keyLen:(i+1)*keyLen]...)
		}
		msgs = append(msgs, netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | op), Flags: flags},
			Data:   b,
		})
		keys = keys[n*keyLen:]
	}
	return msgs
}

func batchMsg(typ uint16) netlink.Message {
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}, // res_id, big-endian
	}
}

// batch sends msgs as one transaction; the kernel commits all of them or
// none. Only the last message asks for an acknowledgement: the kernel
// reports every failing message whatever its flags, in order, so the
// acknowledgement comes after any error and means the batch committed.
func (w *wire) batch(msgs []netlink.Message) error {
	all := make([]netlink.Message, 0, len(msgs)+2)
	all = append(all, batchMsg(unix.NFNL_MSG_BATCH_BEGIN))
	for i, m := range msgs {
		if i < len(msgs)-1 {
			m.Header.Flags &^= netlink.Acknowledge
		} else {
			m.Header.Flags |= netlink.Acknowledge
		}
		all = append(all, m)
	}
	all = append(all, batchMsg(unix.NFNL_MSG_BATCH_END))
	if _, err := w.c.SendMessages(all); err != nil {
		return err
	}
	for {
		replies, err := w.c.Receive()
		if err != nil {
			return err
		}
		for _, r := range replies {
			if r.Header.Type == netlink.Error && len(r.Data) >= 4 && binary.NativeEndian.Uint32(r.Data[:4]) == 0 {
				return nil
			}
		}
	}
}
