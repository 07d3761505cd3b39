// Package allowlist is tb-allow: it classifies a lease's observables (C2,
// scanning, abuse, infrastructure), keeps each allow list as a hash chain
// of revisions, and pushes the active entries to the live firewall and the
// DNS sinkhole's forward list.
package allowlist

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/dnsname"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Policy is tb-allow's policy file: classifier thresholds, what is never
// allowed, caps and names that need an operator's approval. Every field
// has a documented default (DefaultPolicy, tb-allow(1)); a file sets only
// what it changes.
type Policy struct {
	// Documentation lets 192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24
	// stand in for the internet (tests and the demo). Off by default.
	Documentation bool `json:"documentation"`
	// Verdict is the firewall verdict of promoted endpoints: rate-limit
	// (the lease's rate limit applies) or forward.
	Verdict string `json:"verdict"`
	// TTL is how long an entry stays active after promotion.
	TTL records.Duration `json:"ttl"`
	// PromoteScore is the score from which a C2 candidate is activated;
	// CandidateScore the score from which it is recorded as a candidate.
	PromoteScore   float64 `json:"promote_score"`
	CandidateScore float64 `json:"candidate_score"`
	// MinConns is the number of connections that counts as repeated
	// contact; MinBeacons the starts needed to estimate a period, and
	// MaxJitter the largest relative deviation of the intervals that is
	// still periodic.
	MinConns   int     `json:"min_conns"`
	MinBeacons int     `json:"min_beacons"`
	MaxJitter  float64 `json:"max_jitter"`
	// FewDestinations: a lease that contacts at most this many
	// destinations (scans and infrastructure aside) talks to "few".
	FewDestinations int `json:"few_destinations"`
	// LongSession is the duration from which a session is long-lived.
	LongSession records.Duration `json:"long_session"`
	// ScanMinTargets distinct destinations on one port make a scan;
	// ScanPortMinTargets on the ports of ScanPorts (telnet, SSH, …).
	ScanMinTargets     int      `json:"scan_min_targets"`
	ScanPortMinTargets int      `json:"scan_port_min_targets"`
	ScanPorts          []uint16 `json:"scan_ports"`
	// SweepMinRun consecutive addresses contacted make a sweep.
	SweepMinRun int `json:"sweep_min_run"`
	// FloodConns connections (or FloodPackets packets) to one destination
	// within one observation make a flood.
	FloodConns   int64 `json:"flood_conns"`
	FloodPackets int64 `json:"flood_packets"`
	// SMTPPorts are spam: never promoted.
	SMTPPorts []uint16 `json:"smtp_ports"`
	// AttackPatterns are substrings of HTTP requests that mark exploitation
	// (botnet propagation), never promoted.
	AttackPatterns []string `json:"attack_patterns"`
	// InfraServices ("udp/123") and InfraNames (glob patterns) are known
	// infrastructure the lab itself provides or fakes: never promoted.
	InfraServices []string `json:"infra_services"`
	InfraNames    []string `json:"infra_names"`
	// NeverAllow are prefixes and NeverAllowNames name patterns that are
	// refused whatever the evidence.
	NeverAllow      []string `json:"never_allow"`
	NeverAllowNames []string `json:"never_allow_names"`
	// ApprovalNames are name patterns that need an operator's approval:
	// their entries (and the endpoints they resolved to) stay
	// pending-approval until "tb-allow approve".
	ApprovalNames []string `json:"approval_names"`
	// MaxPerLease caps the active endpoints of one lease; MaxNames its
	// active names. The best-scored win.
	MaxPerLease int `json:"max_per_lease"`
	MaxNames    int `json:"max_names"`
	// MaxPerCycle caps the entries one promotion (one cycle's evidence)
	// activates, endpoints and names together.
	MaxPerCycle int `json:"max_per_cycle"`

	neverAllow []netip.Prefix
}

// DefaultPolicy is the policy without a file.
func DefaultPolicy() Policy {
	return Policy{
		Verdict:            string(firewall.RateLimit),
		TTL:                records.Duration(24 * time.Hour),
		PromoteScore:       0.6,
		CandidateScore:     0.3,
		MinConns:           3,
		MinBeacons:         4,
		MaxJitter:          0.35,
		FewDestinations:    8,
		LongSession:        records.Duration(5 * time.Minute),
		ScanMinTargets:     16,
		ScanPortMinTargets: 4,
		ScanPorts:          []uint16{22, 23, 2222, 2323, 5555, 7547, 37215, 52869, 445, 1433, 3306, 3389, 5900, 6379, 8291, 9200},
		SweepMinRun:        8,
		FloodConns:         500,
		FloodPackets:       20000,
		SMTPPorts:          append([]uint16(nil), firewall.DefaultSMTPPorts...),
		AttackPatterns: []string{"/shell?", "/cgi-bin/", "gponform", "/hnap1", "/setup.cgi", "wget ", "wget+", "curl+",
			"/bin/busybox", "chmod 777", "/picsdesc.xml", "/ctrlt/deviceupgrade", "/boaform/", "${jndi:", "/vendor/phpunit/", "/.env"},
		InfraServices: []string{"udp/53", "tcp/53", "udp/67", "udp/68", "udp/123", "udp/137", "udp/138", "udp/1900", "udp/5353", "udp/5355"},
		InfraNames: []string{"*.ntp.org", "ntp.*", "time.*", "*.time.*", "connectivitycheck.gstatic.com", "connectivitycheck.android.com",
			"clients3.google.com", "detectportal.firefox.com", "www.msftconnecttest.com", "www.msftncsi.com", "captive.apple.com",
			"nmcheck.gnome.org", "connectivity-check.ubuntu.com", "network-test.debian.org", "*.in-addr.arpa", "*.ip6.arpa",
			"wpad", "wpad.*", "localhost", "*.local"},
		NeverAllow:      []string{},
		NeverAllowNames: []string{"*.gov", "*.mil"},
		ApprovalNames: []string{"*.githubusercontent.com", "github.com", "pastebin.com", "*.pastebin.com", "api.telegram.org",
			"*.discord.com", "discord.com", "*.discordapp.com", "*.ngrok.io", "*.ngrok-free.app", "*.amazonaws.com",
			"*.cloudfront.net", "*.googleapis.com", "drive.google.com", "*.dropboxusercontent.com", "*.onion"},
		MaxPerLease: 32,
		MaxNames:    16,
		MaxPerCycle: 4,
	}
}

// LoadPolicy reads a policy file over the defaults ("" = the defaults).
// Unknown keys are errors, so that a misspelt threshold is not ignored.
func LoadPolicy(file string) (Policy, error) {
	p := DefaultPolicy()
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return p, err
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return p, fmt.Errorf("policy %s: %w", file, err)
		}
	}
	return p, p.compile()
}

func (p *Policy) compile() error {
	var errs []string
	if _, err := firewall.ParseVerdict(p.Verdict); err != nil || (p.Verdict != string(firewall.Forward) && p.Verdict != string(firewall.RateLimit)) {
		errs = append(errs, fmt.Sprintf("verdict %q: must be forward or rate-limit", p.Verdict))
	}
	if p.PromoteScore <= 0 || p.PromoteScore > 1 || p.CandidateScore < 0 || p.CandidateScore > p.PromoteScore {
		errs = append(errs, "scores: want 0 <= candidate_score <= promote_score <= 1, promote_score > 0")
	}
	if p.TTL <= 0 {
		errs = append(errs, "ttl must be positive")
	}
	p.neverAllow = nil
	for _, s := range p.NeverAllow {
		pf, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				errs = append(errs, fmt.Sprintf("never_allow %q: not a prefix or address", s))
				continue
			}
			pf = netip.PrefixFrom(a, a.BitLen())
		}
		p.neverAllow = append(p.neverAllow, pf.Masked())
	}
	for _, s := range p.InfraServices {
		if _, _, ok := parseService(s); !ok {
			errs = append(errs, fmt.Sprintf("infra_services %q: want PROTO/PORT", s))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("policy: %s", strings.Join(errs, "; "))
	}
	return nil
}

func parseService(s string) (proto string, port uint16, ok bool) {
	proto, ps, found := strings.Cut(s, "/")
	if !found {
		return "", 0, false
	}
	var n int
	if _, err := fmt.Sscanf(ps, "%d", &n); err != nil || n <= 0 || n > 65535 {
		return "", 0, false
	}
	return strings.ToLower(proto), uint16(n), true
}

func matchAny(patterns []string, name string) string {
	for _, p := range patterns {
		if dnsname.Match(p, name) {
			return p
		}
	}
	return ""
}

func (p *Policy) isInfraService(proto string, port uint16) bool {
	return slices.ContainsFunc(p.InfraServices, func(s string) bool {
		pr, po, ok := parseService(s)
		return ok && pr == proto && po == port
	})
}

func (p *Policy) isScanPort(port uint16) bool { return slices.Contains(p.ScanPorts, port) }

func (p *Policy) isSMTP(proto string, port uint16) bool {
	return proto == "tcp" && slices.Contains(p.SMTPPorts, port)
}

// neverAllowed names the never-allow prefix that contains a.
func (p *Policy) neverAllowed(a netip.Addr) string {
	for _, pf := range p.neverAllow {
		if pf.Contains(a) {
			return pf.String()
		}
	}
	return ""
}
