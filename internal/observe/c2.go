package observe

import (
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// mergeC2 folds the bot-channel types' context objects (see
// internal/observe/botproto) into dst.
func mergeC2(dst, src *records.Observable) {
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

func sizeOfC2(o *records.Observable) int {
	n := 0
	if c := o.C2Channel; c != nil {
		n += 128 + len(c.Family) + len(c.Protocol) + len(c.Server) + strs(c.Clients) + strs(c.Identities) + strs(c.Channels) + strs(c.Reports)
	}
	if c := o.C2Command; c != nil {
		n += 128 + len(c.Family) + len(c.Protocol) + len(c.Vector) + len(c.Raw) + strs(c.Targets) + strs(c.Ports) + strs(c.Options) +
			strs(c.Servers) + strs(c.Clients)
	}
	return n
}
