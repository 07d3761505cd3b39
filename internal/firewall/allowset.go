package firewall

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// smallChange is the largest change applied without reading any of the
// lease's sets: each element is destroyed in every set it must not be in
// and added where it belongs, which needs no knowledge of the sets.
const smallChange = 256

// nftMsgDestroySetElem deletes an element if it is there and is a no-op
// otherwise (Linux 6.3).
const nftMsgDestroySetElem = 30

// keyLen is the length of an element's key: ipv4_addr . inet_proto .
// inet_service, each padded to four bytes.
const keyLen = 12

type key [keyLen]byte

func keyOf(e Element) key {
	var k key
	a := e.Dst.As4()
	copy(k[0:4], a[:])
	k[4] = protoNum(e.Proto)
	binary.BigEndian.PutUint16(k[8:10], e.Port)
	return k
}

// readLimit is the most elements read of a set before a large change:
// a bigger set is changed without being read.
const readLimit = 8192

// AllowSet implements Firewall.
func (f *NFT) AllowSet(ctx context.Context, lease string) ([]Element, error) {
	tag, err := leaseTag(lease)
	if err != nil {
		return nil, err
	}
	o := f.leaseObjs(f.inet(), tag)
	var out []Element
	err = f.inNS(false, func(w *wire) error {
		hasReflect, err := f.leaseSets(w, lease, o)
		if err != nil {
			return err
		}
		sets, err := f.readSets(w, o, hasReflect, 0)
		if err != nil {
			return err
		}
		for v, in := range sets {
			for k := range in {
				if e, ok := keyElem(k[:], v); ok {
					out = append(out, e)
				}
			}
		}
		return nil
	})
	sortElements(out)
	return out, err
}

// leaseSets reports whether the lease has its sets (ErrNoLease if not)
// and whether it has a reflect set (only when its tap was given).
func (f *NFT) leaseSets(w *wire, lease string, o *leaseObjs) (hasReflect bool, err error) {
	ok, err := w.setsExist(o.sets[Forward], o.sets[Reflect])
	if err != nil {
		return false, fmt.Errorf("nftables: reading the sets of %s: %w", lease, err)
	}
	if !ok[0] {
		return false, fmt.Errorf("%s: %w", lease, ErrNoLease)
	}
	return ok[1], nil
}

// known is what was read of a lease's verdict sets: the keys of each set
// read whole; none for a set not read.
type known map[Verdict]map[key]bool

// readSets reads the lease's verdict sets, each whole or, past limit
// elements (limit > 0), not at all.
func (f *NFT) readSets(w *wire, o *leaseObjs, hasReflect bool, limit int) (known, error) {
	sets := known{}
	for _, v := range Verdicts {
		if v == Reflect && !hasReflect {
			continue
		}
		s := o.sets[v]
		keys, complete, err := w.setKeys(byte(s.Table.Family), s.Table.Name, s.Name, keyLen, limit)
		if err != nil {
			return nil, fmt.Errorf("nftables: reading %s: %w", s.Name, err)
		}
		if !complete {
			continue
		}
		in := make(map[key]bool, len(keys)/keyLen)
		for ; len(keys) >= keyLen; keys = keys[keyLen:] {
			in[key(keys[:keyLen])] = true
		}
		sets[v] = in
	}
	return sets, nil
}

// ApplyAllowSet implements Firewall: validate, work out each set's
// additions and deletions, and commit them in one netlink batch. An
// element is deleted from a set read beforehand only if there, and
// destroyed (NFT_MSG_DESTROYSETELEM, Linux ≥ 6.3: a no-op when absent)
// in one not read; it is added to its own set unless read there, and
// taken out of the others. A change of up to smallChange elements reads
// no set; a bigger one reads those of at most readLimit elements.
func (f *NFT) ApplyAllowSet(ctx context.Context, lease string, add, del []Element) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := leaseTag(lease)
	if err != nil {
		return &InvalidError{Reasons: []string{err.Error()}}
	}
	o := f.leaseObjs(f.inet(), tag)
	big := len(add)+len(del) > smallChange
	return f.inNS(big, func(w *wire) error {
		hasReflect, err := f.leaseSets(w, lease, o)
		if err != nil {
			return err
		}
		smtp := false
		if f.smtpAsked(add) {
			labels, err := w.ruleLabels(byte(o.fwd.Table.Family), o.fwd.Table.Name, o.fwd.Name)
			smtp = err == nil && !slices.Contains(labels, "smtp never forwarded")
		}
		var host []netip.Addr
		if len(add) > 0 {
			host = hostAddrs("")
		}
		if err := f.policy(smtp, host).Plan(add, del); err != nil {
			return err
		}
		if needsUplink(add) {
			if err := f.uplinkUp(""); err != nil {
				return &InvalidError{Reasons: []string{err.Error()}}
			}
		}
		if hasVerdict(add, Reflect) && !hasReflect {
			return &InvalidError{Reasons: []string{"reflect needs the lease's tap, which was not given when its rules were applied"}}
		}
		sets := known{}
		if big {
			if sets, err = f.readSets(w, o, hasReflect, readLimit); err != nil {
				return err
			}
		}
		msgs := change(sets, hasReflect, add, del).msgs(o)
		if len(msgs) == 0 {
			return nil
		}
		if err := w.batch(msgs); err != nil {
			return fmt.Errorf("nftables: updating allow set of %s (nothing changed): %w", lease, err)
		}
		return nil
	})
}

// smtpAsked reports whether an addition is one the lease's SMTP setting
// decides: forwarding to an SMTP port over TCP.
func (f *NFT) smtpAsked(add []Element) bool {
	return slices.ContainsFunc(add, func(e Element) bool {
		return e.Proto == "tcp" && (e.Verdict == Forward || e.Verdict == RateLimit) && slices.Contains(f.cfg.SMTPPorts, e.Port)
	})
}

// setChange is a change per verdict set: the keys to destroy (absent is
// fine), to delete (present for sure) and to add, keyLen bytes apiece.
type setChange struct {
	destroy, del, add map[Verdict][]byte
}

// change is what the batch must do to each set, from what is known of
// the sets (which it updates as it goes, so that nothing is deleted
// twice; adding twice is harmless).
func change(sets known, hasReflect bool, add, del []Element) setChange {
	ch := setChange{destroy: map[Verdict][]byte{}, del: map[Verdict][]byte{}, add: map[Verdict][]byte{}}
	for _, v := range Verdicts {
		if v == Reflect && !hasReflect {
			continue
		}
		in, read := sets[v]
		remove := func(k key) {
			switch {
			case !read:
				ch.destroy[v] = append(ch.destroy[v], k[:]...)
			case in[k]:
				ch.del[v] = append(ch.del[v], k[:]...)
				delete(in, k)
			}
		}
		for _, e := range del {
			remove(keyOf(e))
		}
		for _, e := range add {
			k := keyOf(e)
			switch {
			case e.Verdict != v:
				remove(k)
			case !in[k]:
				ch.add[v] = append(ch.add[v], k[:]...)
			}
		}
	}
	return ch
}

// msgs are the change's messages, in verdict order: removals first.
func (ch setChange) msgs(o *leaseObjs) []netlink.Message {
	var msgs []netlink.Message
	for _, op := range []struct {
		typ  uint16
		keys map[Verdict][]byte
	}{{nftMsgDestroySetElem, ch.destroy}, {unix.NFT_MSG_DELSETELEM, ch.del}, {unix.NFT_MSG_NEWSETELEM, ch.add}} {
		for _, v := range Verdicts {
			if keys := op.keys[v]; len(keys) > 0 {
				s := o.sets[v]
				msgs = elemMsgs(msgs, op.typ, byte(s.Table.Family), s.Table.Name, s.Name, keys, keyLen)
			}
		}
	}
	return msgs
}
