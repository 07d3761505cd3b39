package observe

import (
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// mergeC2 folds the bot-channel and attack types' context objects (see
// internal/decode/botproto) into dst.
func mergeC2(dst, src *records.Observable) {
	mergeAttack(dst, src)
	if s := src.C2Channel; s != nil {
		if dst.C2Channel == nil {
			dst.C2Channel = &records.C2ChannelInfo{Family: s.Family, Protocol: s.Protocol, Server: s.Server}
		}
		d := dst.C2Channel
		// The mean interval over both sightings' keep-alives: each
		// sighting's mean weighs by the intervals it spans.
		dn, sn := max(d.KeepAlives-1, 0), max(s.KeepAlives-1, 0)
		if dn+sn > 0 {
			d.KeepAlivePeriod = (d.KeepAlivePeriod*float64(dn) + s.KeepAlivePeriod*float64(sn)) / float64(dn+sn)
		}
		d.KeepAlives += s.KeepAlives
		d.Commands += s.Commands
		d.Clients = union(d.Clients, s.Clients, MaxList)
		d.Identities = union(d.Identities, s.Identities, MaxList)
		d.Channels = union(d.Channels, s.Channels, MaxList)
		d.Reports = union(d.Reports, s.Reports, MaxList)
	}
	if s := src.C2Command; s != nil {
		if dst.C2Command == nil {
			c := *s
			c.Targets, c.Ports, c.Options = slices.Clone(s.Targets), slices.Clone(s.Ports), slices.Clone(s.Options)
			c.Servers, c.Clients = nil, nil
			dst.C2Command = &c
		}
		d := dst.C2Command
		d.Servers = union(d.Servers, s.Servers, MaxList)
		d.Clients = union(d.Clients, s.Clients, MaxList)
	}
}

// mergeAttack adds up two sightings of one flood: the rates are
// recomputed over the united span (dst's times already united by Merge).
func mergeAttack(dst, src *records.Observable) {
	s := src.Attack
	if s == nil {
		return
	}
	if dst.Attack == nil {
		c := *s
		c.Ports, c.Sources, c.Reflectors = slices.Clone(s.Ports), slices.Clone(s.Sources), slices.Clone(s.Reflectors)
		dst.Attack = &c
		return
	}
	d := dst.Attack
	d.Packets += s.Packets
	d.Bytes += s.Bytes
	d.PortCount = max(d.PortCount, s.PortCount)
	d.Names = max(d.Names, s.Names)
	d.SourceCount = max(d.SourceCount, s.SourceCount)
	d.Spoofed = d.Spoofed || s.Spoofed
	d.Ports = union(d.Ports, s.Ports, MaxList)
	d.Sources = union(d.Sources, s.Sources, MaxList)
	d.Reflectors = union(d.Reflectors, s.Reflectors, MaxList)
	// Of two sightings' orders, the one closer to its attack (then the
	// smaller value): the same whichever sighting is merged first.
	if s.Order != "" && (d.Order == "" || s.OrderDelay < d.OrderDelay || s.OrderDelay == d.OrderDelay && s.Order < d.Order) {
		d.Order, d.OrderDelay = s.Order, s.OrderDelay
	}
	if span := dst.LastSeen.Sub(dst.FirstSeen).Seconds(); span > 0 {
		d.PPS = Rate(d.Packets, span)
		d.BPS = Rate(d.Bytes, span)
	}
}

// Rate is n per second over span seconds, to two decimals.
func Rate(n int64, span float64) float64 {
	return float64(int64(float64(n)/span*100+0.5)) / 100
}

func sizeOfC2(o *records.Observable) int {
	n := 0
	if a := o.Attack; a != nil {
		n += 192 + len(a.Vector) + len(a.Target) + len(a.Order) + strs(a.Ports) + strs(a.Sources) + strs(a.Reflectors)
	}
	if c := o.C2Channel; c != nil {
		n += 128 + len(c.Family) + len(c.Protocol) + len(c.Server) + strs(c.Clients) + strs(c.Identities) + strs(c.Channels) + strs(c.Reports)
	}
	if c := o.C2Command; c != nil {
		n += 128 + len(c.Family) + len(c.Protocol) + len(c.Vector) + len(c.Raw) + strs(c.Targets) + strs(c.Ports) + strs(c.Options) +
			strs(c.Servers) + strs(c.Clients)
	}
	return n
}
