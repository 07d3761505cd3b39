// Package mitre maps Talkbox's observables to MITRE ATT&CK techniques:
// one table, versioned by the ATT&CK release it follows, used by the
// report and the exports.
//
// A mapping is here only where it is unambiguous from what the
// observable itself says: a write to /etc/cron.d is Cron; a watchdog
// opened, a competitor killed or an io_uring set up are not mapped, since
// no one technique says what they are for.
package mitre

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Release is the ATT&CK release the table follows (Enterprise matrix).
const Release = "ATT&CK Enterprise v17"

// Technique is one ATT&CK technique or sub-technique.
type Technique struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// URL is the technique's page on attack.mitre.org.
func (t Technique) URL() string {
	return "https://attack.mitre.org/techniques/" + strings.ReplaceAll(t.ID, ".", "/") + "/"
}

// The table: each technique Talkbox can name.
var (
	cron            = Technique{"T1053.003", "Scheduled Task/Job: Cron"}
	systemdService  = Technique{"T1543.002", "Create or Modify System Process: Systemd Service"}
	rcScripts       = Technique{"T1037.004", "Boot or Logon Initialization Scripts: RC Scripts"}
	dynamicLinker   = Technique{"T1574.006", "Hijack Execution Flow: Dynamic Linker Hijacking"}
	sshKeys         = Technique{"T1098.004", "Account Manipulation: SSH Authorized Keys"}
	shellConfig     = Technique{"T1546.004", "Event Triggered Execution: Unix Shell Configuration Modification"}
	firewall        = Technique{"T1562.004", "Impair Defenses: Disable or Modify System Firewall"}
	disableTools    = Technique{"T1562.001", "Impair Defenses: Disable or Modify Tools"}
	ptraceInjection = Technique{"T1055.008", "Process Injection: Ptrace System Calls"}
	fileDeletion    = Technique{"T1070.004", "Indicator Removal: File Deletion"}
	debuggerEvasion = Technique{"T1622", "Debugger Evasion"}
	systemChecks    = Technique{"T1497.001", "Virtualization/Sandbox Evasion: System Checks"}
	timeEvasion     = Technique{"T1497.003", "Virtualization/Sandbox Evasion: Time Based Evasion"}
	masquerading    = Technique{"T1036", "Masquerading"}
	serviceScan     = Technique{"T1046", "Network Service Discovery"}
	webProtocols    = Technique{"T1071.001", "Application Layer Protocol: Web Protocols"}
	appLayer        = Technique{"T1071", "Application Layer Protocol"}
	nonAppLayer     = Technique{"T1095", "Non-Application Layer Protocol"}
	nonStandardPort = Technique{"T1571", "Non-Standard Port"}
	passwordGuess   = Technique{"T1110.001", "Brute Force: Password Guessing"}
	directFlood     = Technique{"T1498.001", "Network Denial of Service: Direct Network Flood"}
	reflection      = Technique{"T1498.002", "Network Denial of Service: Reflection Amplification"}
	serviceFlood    = Technique{"T1499.002", "Endpoint Denial of Service: Service Exhaustion Flood"}
)

// persistence and evasion map behave's technique names (TechniqueInfo).
var persistence = map[string]Technique{
	"cron": cron, "systemd": systemdService, "init": rcScripts, "ld-preload": dynamicLinker,
	"ssh-key": sshKeys, "profile": shellConfig, "firewall": firewall, "inject": ptraceInjection,
}

var evasion = map[string]Technique{
	"self-delete": fileDeletion, "tracer-check": debuggerEvasion, "ptrace": debuggerEvasion,
	"cpuinfo": systemChecks, "dmi": systemChecks, "sleep": timeEvasion, "clock": timeEvasion, "trace-tampered": disableTools, "cgroup": disableTools,
}

// standardPorts are the ports a C2 channel's protocol has by standard.
var standardPorts = map[string][]uint16{
	"http": {80, 8080},
	"irc":  {6667, 6697, 194},
}

// For is the techniques an observable shows, none when unmapped.
func For(o *records.Observable) []Technique {
	var out []Technique
	switch {
	case o.Persistence != nil:
		if t, ok := persistence[o.Persistence.Technique]; ok {
			out = append(out, t)
		}
	case o.Evasion != nil:
		if t, ok := evasion[o.Evasion.Technique]; ok {
			out = append(out, t)
		}
	case o.Process != nil:
		if len(o.Process.Names) > 0 {
			out = append(out, masquerading)
		}
	case o.Scan != nil:
		out = append(out, serviceScan)
	case o.C2Channel != nil:
		c := o.C2Channel
		switch c.Protocol {
		case "http":
			out = append(out, webProtocols)
		case "irc":
			out = append(out, appLayer)
		case "mirai-report":
			// The report carries the credentials the bot guessed.
			out = append(out, nonAppLayer, passwordGuess)
		default:
			out = append(out, nonAppLayer)
		}
		if std, ok := standardPorts[c.Protocol]; ok {
			if ap, err := netip.ParseAddrPort(c.Server); err == nil && !slices.Contains(std, ap.Port()) {
				out = append(out, nonStandardPort)
			}
		}
	case o.Attack != nil:
		switch v := o.Attack.Vector; {
		case strings.HasPrefix(v, "amp-"):
			out = append(out, reflection)
		case v == "http":
			out = append(out, serviceFlood)
		default:
			out = append(out, directFlood)
		}
	}
	return out
}

// Named are the techniques of the IDs, in their order; an ID the table
// does not know (a record written by another release) keeps its ID alone.
func Named(ids []string) []Technique {
	var out []Technique
	for _, id := range ids {
		t := Technique{ID: id}
		for _, k := range all {
			if k.ID == id {
				t = k
				break
			}
		}
		out = append(out, t)
	}
	return out
}

// all is every technique of the table.
var all = []Technique{cron, systemdService, rcScripts, dynamicLinker, sshKeys, shellConfig, firewall, disableTools,
	ptraceInjection, fileDeletion, debuggerEvasion, systemChecks, timeEvasion, masquerading, serviceScan, webProtocols,
	appLayer, nonAppLayer, nonStandardPort, passwordGuess, directFlood, reflection, serviceFlood}

// IDs are the technique IDs of the observables, each once, sorted.
func IDs(obs []*records.Observable) []string {
	var ids []string
	for _, o := range obs {
		for _, t := range For(o) {
			if !slices.Contains(ids, t.ID) {
				ids = append(ids, t.ID)
			}
		}
	}
	slices.Sort(ids)
	return ids
}
