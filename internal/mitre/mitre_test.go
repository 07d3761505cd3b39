package mitre

import (
	"slices"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func ids(ts []Technique) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

// TestFor: what each kind of observable maps to, and what stays unmapped.
func TestFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    records.Observable
		want []string
	}{
		{"cron", records.Observable{Persistence: &records.TechniqueInfo{Technique: "cron"}}, []string{"T1053.003"}},
		{"ld.so.preload", records.Observable{Persistence: &records.TechniqueInfo{Technique: "ld-preload"}}, []string{"T1574.006"}},
		{"authorized_keys", records.Observable{Persistence: &records.TechniqueInfo{Technique: "ssh-key"}}, []string{"T1098.004"}},
		{"rc scripts", records.Observable{Persistence: &records.TechniqueInfo{Technique: "init"}}, []string{"T1037.004"}},
		{"systemd", records.Observable{Persistence: &records.TechniqueInfo{Technique: "systemd"}}, []string{"T1543.002"}},
		{"firewall", records.Observable{Persistence: &records.TechniqueInfo{Technique: "firewall"}}, []string{"T1562.004"}},
		{"watchdog: what for?", records.Observable{Persistence: &records.TechniqueInfo{Technique: "watchdog"}}, nil},
		{"self-delete", records.Observable{Evasion: &records.TechniqueInfo{Technique: "self-delete"}}, []string{"T1070.004"}},
		{"tracer check", records.Observable{Evasion: &records.TechniqueInfo{Technique: "tracer-check"}}, []string{"T1622"}},
		{"dmi", records.Observable{Evasion: &records.TechniqueInfo{Technique: "dmi"}}, []string{"T1497.001"}},
		{"renamed", records.Observable{Process: &records.ProcessInfo{Names: []string{"kworker/u:tb"}}}, []string{"T1036"}},
		{"not renamed", records.Observable{Process: &records.ProcessInfo{}}, nil},
		{"scan", records.Observable{Scan: &records.ScanInfo{}}, []string{"T1046"}},
		{"mirai", records.Observable{C2Channel: &records.C2ChannelInfo{Protocol: "mirai", Server: "198.51.100.7:23"}}, []string{"T1095"}},
		{"mirai report", records.Observable{C2Channel: &records.C2ChannelInfo{Protocol: "mirai-report", Server: "198.51.100.7:48101"}}, []string{"T1095", "T1110.001"}},
		{"irc, standard port", records.Observable{C2Channel: &records.C2ChannelInfo{Protocol: "irc", Server: "198.51.100.7:6667"}}, []string{"T1071"}},
		{"irc, odd port", records.Observable{C2Channel: &records.C2ChannelInfo{Protocol: "irc", Server: "198.51.100.7:3211"}}, []string{"T1071", "T1571"}},
		{"http polling", records.Observable{C2Channel: &records.C2ChannelInfo{Protocol: "http", Server: "198.51.100.7:80"}}, []string{"T1071.001"}},
		{"syn flood", records.Observable{Attack: &records.AttackInfo{Vector: "syn"}}, []string{"T1498.001"}},
		{"ntp amplification", records.Observable{Attack: &records.AttackInfo{Vector: "amp-ntp"}}, []string{"T1498.002"}},
		{"http flood", records.Observable{Attack: &records.AttackInfo{Vector: "http"}}, []string{"T1499.002"}},
		{"a domain", records.Observable{Domain: &records.DomainInfo{}}, nil},
	} {
		if got := ids(For(&tc.o)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		for _, n := range Named(tc.want) {
			if n.Name == "" {
				t.Errorf("%s: %s is not in the table's list", tc.name, n.ID)
			}
		}
	}
	if u := (Technique{ID: "T1053.003"}).URL(); u != "https://attack.mitre.org/techniques/T1053/003/" {
		t.Errorf("url %s", u)
	}
}
