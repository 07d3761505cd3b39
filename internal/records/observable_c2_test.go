package records

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"testing"
)

// The hand-written encoder writes the bot-channel and attack types exactly as
// encoding/json would.
func TestC2ObservableJSONMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	secs := []float64{0, 1.5, 0.000001, 60}
	for i := 0; i < 2000; i++ {
		o := randObservable(r)
		switch r.Intn(3) {
		case 0:
			o.Attack = &AttackInfo{Vector: randString(r), Target: randString(r), Names: r.Int63n(3), Ports: randStrings(r), PortCount: r.Int63n(9),
				Packets: r.Int63n(9), Bytes: r.Int63n(9), PPS: secs[r.Intn(len(secs))], BPS: secs[r.Intn(len(secs))],
				Spoofed: r.Intn(2) == 0, Sources: randStrings(r), SourceCount: r.Int63n(9), Reflectors: randStrings(r)}
			if r.Intn(2) == 0 {
				o.Attack.Order, o.Attack.OrderDelay = randString(r), secs[r.Intn(len(secs))]
			}
		case 1:
			o.C2Channel = &C2ChannelInfo{Family: randString(r), Protocol: randString(r), Server: randString(r), Clients: randStrings(r),
				Identities: randStrings(r), Channels: randStrings(r), KeepAlives: r.Int63n(9), KeepAlivePeriod: secs[r.Intn(len(secs))],
				Commands: r.Int63n(3), Reports: randStrings(r)}
		default:
			o.C2Command = &C2CommandInfo{Family: randString(r), Protocol: randString(r), Vector: randString(r), Targets: randStrings(r),
				Ports: randStrings(r), Duration: r.Int63n(3), Options: randStrings(r), Raw: randString(r), Servers: randStrings(r),
				Clients: randStrings(r)}
		}
		got := o.AppendJSON(nil)
		want, err := json.Marshal((*plain)(o))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d:\n got %s\nwant %s", i, got, want)
		}
		var back Observable
		if err := Unmarshal(got, &back); err != nil {
			t.Fatalf("%s: %v", got, err)
		}
		again := back.AppendJSON(nil)
		if want, _ := json.Marshal((*plain)(&back)); !bytes.Equal(again, want) {
			t.Fatalf("decoded record:\n got %s\nwant %s", again, want)
		}
	}
}
