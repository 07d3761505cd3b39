package leasetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Lab is a real Talkbox lab brought up for a test's leases: tb-lease
// starts guests only on a lab's bridge that passed its containment check.
type Lab struct {
	Name   string
	Bridge string
	// LabNet is the leases' network (tb-lease --lab-net).
	LabNet netip.Prefix
	SinkNS string
	dir    string
	// uplinkNS holds the far end of UpDocumentationLab's uplink.
	uplinkNS string
	tag      string // the names' suffix, and the owner record's name
}

// upUplink makes the uplink a veth whose peer is alone, down, in a
// network namespace of its own: what is forwarded goes nowhere.
func (l *Lab) upUplink(name, ns string) error {
	if err := netns.Create(ns); err != nil {
		return err
	}
	l.uplinkNS = ns
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: name + "p"}); err != nil {
		return err
	}
	peer, err := netlink.LinkByName(name + "p")
	if err != nil {
		return err
	}
	f, err := os.Open(netns.Path(ns))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := netlink.LinkSetNsFd(peer, int(f.Fd())); err != nil {
		return err
	}
	up, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(up)
}

// netLock serialises the choice of free networks between test processes.
const netLock = "/run/talkbox-leasetest-net.lock"

// UpLab brings up a lab in the network namespace hostNS ("" for this one)
// with bridge ("" for a new name) and network labNet (zero for a free
// one), unique names, no services and no uplink, records it in the state
// directory and checks its containment, as tb-capture net up does. Down
// takes it down.
func UpLab(ctx context.Context, stateDir, hostNS, bridge string, labNet netip.Prefix, opts ...state.Option) (*Lab, error) {
	return upLab(ctx, stateDir, hostNS, bridge, labNet, false, opts...)
}

// UpDocumentationLab is UpLab in this namespace, on new names, whose
// firewall accepts a lease's allowed destinations (tb-allow's forward
// elements) in the documentation ranges that stand in for the internet
// (tb-capture net up --documentation): its uplink is a dummy interface,
// which discards whatever would be forwarded, so nothing leaves the
// machine.
func UpDocumentationLab(ctx context.Context, stateDir string, opts ...state.Option) (*Lab, error) {
	return upLab(ctx, stateDir, "", "", netip.Prefix{}, true, opts...)
}

func upLab(ctx context.Context, stateDir, hostNS, bridge string, labNet netip.Prefix, documentation bool, opts ...state.Option) (*Lab, error) {
	var b [4]byte
	rand.Read(b[:])
	tag := hex.EncodeToString(b[:])[:8]
	if bridge == "" {
		bridge = "tblt" + tag
	}
	st, err := state.Open(ctx, stateDir, opts...)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	lock, err := lockNets()
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	labtest.ReapStale(ctx, ownerKind, takeDown)
	freeLab, sinkNet, err := freeNets()
	if err != nil {
		return nil, err
	}
	if !labNet.IsValid() {
		labNet = freeLab
	}
	cfg := netlab.Config{Name: "lt" + tag, HostNS: hostNS, Bridge: bridge, LabNet: labNet, SinkNS: "tblts" + tag,
		SinkVeth: "tbltk" + tag, SinkNet: sinkNet, Table: "talkboxlt" + tag}
	cfg.Defaults()
	l := &Lab{Name: cfg.Name, Bridge: bridge, LabNet: labNet, SinkNS: cfg.SinkNS, dir: netlab.Dir(st, cfg.Name), tag: tag}
	if err := labtest.Own(labtest.Owner{Kind: ownerKind, State: stateDir, Dir: l.dir, Tag: tag}); err != nil {
		return nil, err
	}
	if documentation {
		cfg.Documentation, cfg.Uplink = true, "tbltu"+tag
		if err := l.upUplink(cfg.Uplink, "tbltn"+tag); err != nil {
			l.Down()
			return nil, fmt.Errorf("uplink %s: %w", cfg.Uplink, err)
		}
	}
	rep, err := capture.UpLab(ctx, st, cfg)
	if err == nil {
		err = rep.Err()
	}
	if err != nil {
		l.Down()
		return nil, fmt.Errorf("lab %s: %w", cfg.Name, err)
	}
	return l, nil
}

// Down takes the lab down.
func (l *Lab) Down() {
	netlab.Down(context.Background(), l.dir)
	if l.uplinkNS != "" {
		// The veth goes with its peer's namespace.
		netns.Delete(l.uplinkNS)
	}
	labtest.Disown(l.tag)
}

// lockNets takes netLock; closing the file lets it go.
func lockNets() (*os.File, error) {
	lock, err := os.OpenFile(netLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		return nil, err
	}
	return lock, nil
}

// freeNets finds a lab and a sinkhole network no interface of this
// namespace is on (10.215.K.0/24 and 10.216.K.0/24), under netLock.
func freeNets() (lab, sink netip.Prefix, err error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return lab, sink, err
	}
	used := func(p netip.Prefix) bool {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && p.Contains(ip.Unmap()) {
					return true
				}
			}
		}
		return false
	}
	for k := 1; k < 255; k++ {
		lab = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 215, byte(k), 0}), 24)
		sink = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 216, byte(k), 0}), 24)
		if !used(lab) && !used(sink) {
			return lab, sink, nil
		}
	}
	return lab, sink, fmt.Errorf("no free network in 10.215.0.0/16 for a test lab")
}
