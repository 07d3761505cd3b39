package firewall

import (
	"encoding/binary"
	"fmt"
	"os"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// smallChange is the largest change applied without reading the lease's
// sets. Reading them costs O(set size) (about 0.8 s for 100,000 elements);
// a small change instead destroys each element in every set it must not be
// in and adds it where it belongs, which needs no knowledge of the sets.
const smallChange = 256

// nftMsgDestroySetElem deletes an element if it is there and is a no-op
// otherwise (Linux 6.3). google/nftables does not send it, so small changes
// go out as a batch of our own.
const nftMsgDestroySetElem = 30

// applySmall applies add and del in one atomic nfnetlink batch: every
// element is destroyed in the verdict sets other than its own (all of them
// for a delete) and added to its own.
func (f *NFT) applySmall(o *leaseObjs, hasReflect bool, add, del []Element) error {
	sets := func(skip Verdict) []*nftables.Set {
		var out []*nftables.Set
		for _, v := range Verdicts {
			if v == skip || (v == Reflect && !hasReflect) {
				continue
			}
			out = append(out, o.sets[v])
		}
		return out
	}
	msgs := []netlink.Message{batchMsg(unix.NFNL_MSG_BATCH_BEGIN)}
	for _, e := range del {
		for _, s := range sets("") {
			msgs = append(msgs, elemMsg(nftMsgDestroySetElem, s, elemKey(e)))
		}
	}
	for _, e := range add {
		for _, s := range sets(e.Verdict) {
			msgs = append(msgs, elemMsg(nftMsgDestroySetElem, s, elemKey(e)))
		}
		msgs = append(msgs, elemMsg(unix.NFT_MSG_NEWSETELEM, o.sets[e.Verdict], elemKey(e)))
	}
	msgs = append(msgs, batchMsg(unix.NFNL_MSG_BATCH_END))
	return f.sendBatch(msgs)
}

func batchMsg(typ uint16) netlink.Message {
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}, // res_id, big-endian
	}
}

func elemMsg(op uint16, s *nftables.Set, key []byte) netlink.Message {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, s.Table.Name)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(list *netlink.AttributeEncoder) error {
		list.Nested(unix.NFTA_LIST_ELEM, func(el *netlink.AttributeEncoder) error {
			el.Nested(unix.NFTA_SET_ELEM_KEY, func(k *netlink.AttributeEncoder) error {
				k.Bytes(unix.NFTA_DATA_VALUE, key)
				return nil
			})
			return nil
		})
		return nil
	})
	attrs, _ := ae.Encode() // strings and bytes cannot fail to encode
	flags := netlink.Request | netlink.Acknowledge
	if op == unix.NFT_MSG_NEWSETELEM {
		flags |= netlink.Create
	}
	hdr := []byte{byte(s.Table.Family), unix.NFNETLINK_V0, 0, 0}
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | op), Flags: flags},
		Data:   append(hdr, attrs...),
	}
}

// sendBatch sends one batch and waits for an acknowledgement of each of its
// messages; the kernel commits all of them or none.
func (f *NFT) sendBatch(msgs []netlink.Message) error {
	cfg := &netlink.Config{}
	if f.cfg.NetNS != "" {
		ns, err := os.Open(f.cfg.NetNS)
		if err != nil {
			return fmt.Errorf("network namespace: %w", err)
		}
		defer ns.Close()
		cfg.NetNS = int(ns.Fd())
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.Close()
	if err := bigBuffers(c); err != nil {
		return err
	}
	if _, err := c.SendMessages(msgs); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	want := 0
	for _, m := range msgs {
		if m.Header.Flags&netlink.Acknowledge != 0 {
			want++
		}
	}
	for want > 0 {
		replies, err := c.Receive()
		if err != nil {
			return err
		}
		for _, r := range replies {
			if r.Header.Type == netlink.Error && len(r.Data) >= 4 && binary.NativeEndian.Uint32(r.Data[:4]) == 0 {
				want--
			}
		}
	}
	return nil
}
