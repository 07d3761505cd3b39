// Package cbeacon tests the C beacon (beacon.c, policy.c, proto.c): its
// cross builds as Talkbox's triage sees them, and its address policy,
// command line (-hostile's included) and hostile frames against the Go
// beacon's. The beacon itself never runs on the host, natively or under
// qemu-user: the policy tests compile a host driver (testdata/policy_driver.c)
// that links policy.c alone, without the beacon's networking, and compare
// its answers with internal/demo/beacon's; the bot protocols' tests
// (proto_test.go) compile one (testdata/proto_driver.c) that links proto.c
// and policy.c, and compare its bytes and its decoding of a C2's orders with
// the spec and with tb-parse's recognisers (internal/decode/botproto).
package cbeacon

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/triage"
)

// crossBuilds is what each Makefile target must come out as. Compilers
// are Debian's gcc-<triplet> packages (scripts/deps.sh installs them).
var crossBuilds = []struct {
	arch, cc                  string
	triArch, endian, abi, typ string
	bits                      int
	static                    bool
	float, isa, interp        string
}{
	{"armel", "arm-linux-gnueabi-gcc", "arm", "little", "eabi5-sf", "exec", 32, true, "soft", "armv5te", ""},
	// The demo's armel beacon: Debian's default, a PIE that needs armel's loader.
	{"armel-dynamic", "arm-linux-gnueabi-gcc", "arm", "little", "eabi5-sf", "pie", 32, false, "soft", "armv5te", "/lib/ld-linux.so.3"},
	{"armhf", "arm-linux-gnueabihf-gcc", "arm", "little", "eabi5-hf", "exec", 32, true, "hard", "armv7", ""},
	{"mips", "mips-linux-gnu-gcc", "mips", "big", "o32", "exec", 32, true, "hard", "mips32r2", ""},
	{"mipsel", "mipsel-linux-gnu-gcc", "mips", "little", "o32", "exec", 32, true, "hard", "mips32r2", ""},
	{"powerpc", "powerpc-linux-gnu-gcc", "ppc", "big", "", "exec", 32, true, "hard", "", ""},
	{"sh4", "sh4-linux-gnu-gcc", "sh", "little", "", "exec", 32, true, "", "", ""},
	{"m68k", "m68k-linux-gnu-gcc", "m68k", "big", "", "exec", 32, true, "", "", ""},
	{"sparc64", "sparc64-linux-gnu-gcc", "sparc64", "big", "", "exec", 64, true, "", "v9", ""},
	{"i386", "i686-linux-gnu-gcc", "x86", "little", "", "exec", 32, true, "", "", ""},
}

// TestCrossBuildsTriage builds every C beacon with the Makefile's own rules
// (into a temporary directory) and checks each is the ELF the plan needs.
func TestCrossBuildsTriage(t *testing.T) {
	var targets []string
	dir := t.TempDir()
	for _, b := range crossBuilds {
		if _, err := exec.LookPath(b.cc); err != nil {
			t.Fatalf("%s: cross compiler %s missing: run scripts/deps.sh test (Debian package gcc-%s)", b.arch, b.cc, strings.TrimSuffix(b.cc, "-gcc"))
		}
		targets = append(targets, filepath.Join(dir, "cbeacon-"+b.arch))
	}
	cmd := exec.Command("make", append([]string{"-s", "-C", "../../..", "CBEACON_DIR=" + dir}, targets...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make: %v\n%s", err, out)
	}
	for _, b := range crossBuilds {
		tr := inspect(t, filepath.Join(dir, "cbeacon-"+b.arch))
		t.Logf("%-13s %s", b.arch, summary(tr))
		var abi records.ABI
		if tr.ABI != nil {
			abi = *tr.ABI
		}
		if tr.Format != "elf" || tr.Arch != b.triArch || tr.Endianness != b.endian || tr.Bits != b.bits ||
			tr.OS != "linux" || tr.Type != b.typ || abi.Name != b.abi || abi.Float != b.float || abi.ISA != b.isa ||
			tr.Static == nil || *tr.Static != b.static || tr.Interpreter != b.interp || tr.Problem != "" {
			t.Errorf("%s: triage %s\nwant arch=%s endian=%s bits=%d type=%s abi=%s float=%s isa=%s static=%v interp=%s",
				b.arch, summary(tr), b.triArch, b.endian, b.bits, b.typ, b.abi, b.float, b.isa, b.static, b.interp)
		}
	}
}

func inspect(t *testing.T, path string) records.Triage {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return triage.Inspect(f, st.Size())
}

func summary(tr records.Triage) string {
	s := fmt.Sprintf("format=%s arch=%s endian=%s bits=%d os=%s type=%s", tr.Format, tr.Arch, tr.Endianness, tr.Bits, tr.OS, tr.Type)
	if tr.ABI != nil {
		s += fmt.Sprintf(" abi=%s float=%s isa=%s", tr.ABI.Name, tr.ABI.Float, tr.ABI.ISA)
	}
	if tr.Static != nil {
		s += fmt.Sprintf(" static=%v", *tr.Static)
	}
	if tr.Interpreter != "" {
		s += " interp=" + tr.Interpreter
	}
	if tr.Problem != "" {
		s += " problem=" + tr.Problem
	}
	return s
}

// driver compiles testdata/policy_driver.c with policy.c only, for the host.
func driver(t *testing.T) func(args ...string) []string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatal("gcc missing: run scripts/deps.sh test")
	}
	bin := filepath.Join(t.TempDir(), "policy_driver")
	if out, err := exec.Command(cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-o", bin, "testdata/policy_driver.c", "policy.c").CombinedOutput(); err != nil {
		t.Fatalf("building the policy driver: %v\n%s", err, out)
	}
	return func(args ...string) []string {
		out, err := exec.Command(bin, args...).Output()
		if err != nil {
			t.Fatalf("policy_driver %q: %v", args, err)
		}
		return strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	}
}

// TestAddressPolicyMatchesTheGoBeacon asks both beacons about the edges of
// every network and a spread of other addresses: the C one must allow
// exactly what the Go one allows, for a scan and for the C2.
func TestAddressPolicyMatchesTheGoBeacon(t *testing.T) {
	run := driver(t)
	texts := []string{"0.0.0.0", "255.255.255.255", "8.8.8.8", "1.1.1.1", "93.184.216.34", "169.254.1.1",
		"10.0.0.1", "10.13.36.255", "10.13.39.0", "10.213.7.1", "172.16.0.1", "192.168.1.1", "128.0.0.1", "126.255.255.255",
		"192.0.3.1", "198.51.101.1", "203.0.114.9", "192.0.1.255", "198.51.99.255", "203.0.112.255",
		"::1", "::", "2001:db8::1", "::ffff:8.8.8.8", "::ffff:192.0.2.1", "::FFFF:10.13.38.2", "::ffff:127.0.0.1",
		"010.13.37.1", "192.0.2.01", "1.2.3", "1.2.3.4.5", "256.0.0.1", "192.0.2.1 ", "", "c2.example", "-1.0.0.0"}
	for _, n := range []string{"192.0.2", "198.51.100", "203.0.113", "10.13.37", "10.13.38", "127.0.0", "127.255.255"} {
		for _, h := range []string{"0", "1", "127", "254", "255"} {
			texts = append(texts, n+"."+h)
		}
	}
	r := rand.New(rand.NewPCG(7, 11))
	for range 2000 {
		// Mostly near the allowed networks, where a mistake would be.
		a := [4]byte{byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}
		switch r.IntN(4) {
		case 0:
			a[0], a[1] = 10, 13
		case 1:
			a[0] = []byte{127, 192, 198, 203}[r.IntN(4)]
		}
		texts = append(texts, netip.AddrFrom4(a).String())
	}
	lines := run(append([]string{"addr"}, texts...)...)
	if len(lines) != len(texts) {
		t.Fatalf("driver answered %d lines for %d addresses", len(lines), len(texts))
	}
	for i, s := range texts {
		var kind, scan, c2, resolver int
		var ip string
		if _, err := fmt.Sscanf(lines[i], "%d %d %d %d %s", &kind, &scan, &c2, &resolver, &ip); err != nil {
			t.Fatalf("%q: driver said %q", s, lines[i])
		}
		a, err := netip.ParseAddr(s)
		goScan, goC2 := err == nil && beacon.ScanAllowed(a), err == nil && beacon.C2Allowed(a)
		if (scan == 1) != goScan || (c2 == 1) != goC2 {
			t.Errorf("%q: C beacon scan=%d c2=%d, Go beacon scan=%v c2=%v", s, scan, c2, goScan, goC2)
		}
		if err == nil && a.Unmap().Is4() && (kind != 1 || ip != a.Unmap().String()) {
			t.Errorf("%q: C beacon reads %d %s, Go %s", s, kind, ip, a.Unmap())
		}
		if err != nil && kind == 1 {
			t.Errorf("%q: C beacon reads an address, Go does not", s)
		}
		// The resolver may be private too, but never a public address.
		if pub := err == nil && a.Unmap().Is4() && !a.Unmap().IsPrivate() && !goC2; pub && resolver == 1 {
			t.Errorf("%q: C beacon would query a public resolver", s)
		}
	}
}

// TestParseMirrorsTheGoBeacon runs the same command lines through both
// parsers: the same accepted, the same refused, the same configuration.
func TestParseMirrorsTheGoBeacon(t *testing.T) {
	run := driver(t)
	cases := [][]string{
		{"-c2", "c2.example", "-scan", "192.0.2.1, 198.51.100.255", "-scan", "203.0.113.7,10.13.37.20"},
		{"-c2", "c2.example", "-c2-addr", "198.51.100.2", "-interval", "2s", "-count", "6", "-scan", "198.51.100.3", "-scan", "198.51.100.4"},
		{"-c2=c2.example", "--port=8080", "-path", "/x", "-id", "bot-7", "-interval", "1h2m3.5s", "-jitter", "0.5",
			"-count", "0x10", "-retry", "250ms", "-retries", "5", "-timeout", "1.5s", "-scan-port", "2323"},
		{"-c2", "10.13.38.2"}, {"-c2", "127.0.0.1"}, {"-c2", "::ffff:127.0.0.1"}, {"-c2", "x", "-c2-addr", "10.13.38.9"},
		{"-c2", "x", "-c2-addr", "::ffff:192.0.2.5"}, {"-c2", "x", "-scan", ""}, {"-c2", "x", "-scan", ",, ,"},
		{"-c2", "x", "extra", "-scan", "8.8.8.8"}, {"-c2", "x", "--", "-scan", "8.8.8.8"}, {"-c2", "x", "-", "-scan", "8.8.8.8"},
		{"-c2", "x", "-jitter", "1"}, {"-c2", "x", "-jitter", "0"}, {"-c2", "x", "-interval", "1ms", "-retry", "0"},
		{"-c2", "x", "-interval", "300µs"}, {"-c2", "x", "-count", "010"}, {"-c2", "x", "-c2", "y"},
		// Refused or malformed, as the Go beacon's tests list them and more.
		{}, {"-c2", "8.8.8.8"}, {"-c2", "::1"}, {"-c2", "10.13.39.1"}, {"-c2", "2001:db8::1"},
		{"-c2", "x", "-c2-addr", "8.8.8.8"}, {"-c2", "x", "-c2-addr", "nonsense"}, {"-c2", "x", "-c2-addr", "192.0.2.01"},
		{"-c2", "x", "-c2-addr", "::1"}, {"-c2", "x", "-c2-addr", "10.213.1.1"},
		{"-c2", "x", "-port", "0"}, {"-c2", "x", "-port", "65536"}, {"-c2", "x", "-scan-port", "0"}, {"-c2", "x", "-port", "abc"},
		{"-c2", "x", "-jitter", "2"}, {"-c2", "x", "-jitter", "-0.1"}, {"-c2", "x", "-interval", "0"}, {"-c2", "x", "-interval", "5"},
		{"-c2", "x", "-interval", "-1s"}, {"-c2", "x", "-retries", "0"}, {"-c2", "x", "-count", "-1"},
		{"-c2", "x", "-path", "gate"}, {"-c2", "x y"}, {"-c2", "x", "-id", "a\nb"}, {"-c2", "x", "-path", "/a b"},
		{"-c2", "x", "-scan", "nonsense"}, {"-c2", "x", "-bogus", "1"}, {"-c2"}, {"---c2", "x"}, {"-h"},
		{"-c2", "x", "-scan", "192.0.2.1,8.8.8.8"}, {"-c2", "x", "-scan", "::ffff:8.8.8.8"}, {"-c2", "x", "-scan", "10.13.38.2"},
		{"-c2", "x", "-scan", "127.0.0.1"}, {"-c2", "x", "-scan", "2001:db8::1"}, {"-c2", "x", "-scan", "10.0.0.1"},
		// -behave: a scratch directory, and a listener only with it.
		{"-c2", "x", "-behave", "/var/tmp/talkbox/behave", "-behave-listen", "2323"}, {"-c2", "x", "-behave=rel/dir"},
		{"-c2", "x", "-behave", "d", "-behave-listen", "65535"}, {"-c2", "x", "-behave", "d", "-behave-listen", "0"},
		{"-c2", "x", "-behave-listen", "2323"}, {"-c2", "x", "-behave", "", "-behave-listen", "1"},
		{"-c2", "x", "-behave", "d", "-behave-listen", "65536"}, {"-c2", "x", "-behave", "d", "-behave-listen", "-1"},
		{"-c2", "x", "-behave", "d", "-behave-listen", "x"}, {"-c2", "x", "-behave"}, {"-behave-child"},
		{"-c2", "x", "-behave-child"}, {"-c2", "8.8.8.8", "-behave", "d"},
	}
	for _, bad := range []string{"8.8.8.8", "10.0.0.1", "10.13.38.2", "127.0.0.1", "192.0.3.1", "198.51.101.1", "203.0.114.9", "169.254.1.1", "::1", "2001:db8::1", "::ffff:8.8.8.8"} {
		cases = append(cases, []string{"-c2", "c2.example", "-scan", "192.0.2.1," + bad})
	}
	cases = append(cases, hostileCases()...)
	for _, args := range cases {
		got := run(append([]string{"args"}, args...)...)[0]
		cfg, err := beacon.Parse(args, io.Discard)
		switch {
		case err != nil && !strings.HasPrefix(got, "error: "):
			t.Errorf("%q: Go refuses (%v), C accepts: %s", args, err, got)
		case err != nil && (strings.HasPrefix(err.Error(), "refusing") || strings.HasPrefix(err.Error(), "-")) && got != "error: "+err.Error():
			t.Errorf("%q: Go %q, C %q", args, err, got)
		case err == nil && got != goConfig(cfg):
			t.Errorf("%q:\nGo %s\nC  %s", args, goConfig(cfg), got)
		}
	}
}

// hostileArgs are a full set of -hostile flags on a lab link
// 10.213.1.0/24, as the Go beacon's tests have them.
var hostileArgs = []string{"-hostile", "names,spoof,arp,aim,spray", "-gateway", "10.213.1.1",
	"-neighbour", "10.213.1.3", "-neighbour-mac", "52:54:00:00:00:03", "-neighbour-c2", "198.51.100.18:80"}

// hostileCases are command lines with -hostile: accepted, and refused
// for a target outside the documentation ranges and the lab, a bound
// exceeded or a mode without what it needs.
func hostileCases() [][]string {
	cases := [][]string{
		slices.Clone(hostileArgs),
		append(slices.Clone(hostileArgs), "-c2", "c2.example", "-iface", "eth0", "-gateway-mac", "52-54-00-AA-bb-01",
			"-hostile-aim", "198.51.100.247:08443", "-hostile-aim-count", "12", "-hostile-aim-interval", "1.5s",
			"-hostile-spray", "203.0.113.9", "-hostile-spray-ports", "256", "-hostile-dns", "0", "-hostile-dns-domain", "x.example"),
		{"-hostile", "names,aim"}, {"-hostile", "aim, names,aim"}, {"-hostile", "spray", "-gateway", "10.1.2.3"},
		{"-hostile", "spray", "-hostile-dns", "0"}, {"-hostile", "arp", "-gateway", "10.0.0.1", "-neighbour", "10.0.0.2", "-neighbour-mac", "5254.0000.0003"},
		{"-hostile", "", "-c2", "x"}, {"-hostile-aim", "8.8.8.8:1", "-c2", "x"}, {"-hostile-aim", "203.0.113.9:1"},
		{"-hostile", "flood"}, {"-hostile", "names,"}, {"-hostile", "spoof"}, {"-hostile", "arp", "-gateway", "10.213.1.1"}, {"-hostile", "spray"},
		{"-hostile", "names", "-hostile-http", ""}, {"-hostile", "aim", "-hostile-aim", ""},
	}
	for _, bad := range [][]string{
		{"-neighbour", "8.8.8.8"}, {"-neighbour", "192.168.1.3"}, {"-gateway", "172.16.0.1"}, {"-gateway", "::1"},
		{"-gateway", "::ffff:10.0.0.1"}, {"-gateway", "010.0.0.1"}, {"-gateway", "11.0.0.1"}, {"-gateway", "9.255.255.255"},
		{"-neighbour-c2", "8.8.8.8:80"}, {"-neighbour-c2", "10.213.1.1:80"}, {"-neighbour-c2", "198.51.100.18"},
		{"-neighbour-c2", "198.51.100.18:0"}, {"-neighbour-c2", "198.51.100.18:65536"}, {"-neighbour-c2", "[198.51.100.18]:80"},
		{"-neighbour-c2", "198.51.100.18:+80"}, {"-neighbour-c2", "198.51.100.18:"}, {"-neighbour-c2", "198.51.101.18:80"},
		{"-hostile-http", "1.1.1.1:80"}, {"-hostile-http", "192.0.2.80:http"}, {"-hostile-aim", "8.8.4.4:443"},
		{"-hostile-aim", "[2001:db8::1]:443"}, {"-hostile-aim", "203.0.112.255:443"},
		{"-hostile-spray", "127.0.0.1"}, {"-hostile-spray", "10.213.1.1"}, {"-hostile-spray", "192.0.2.81:80"},
		{"-neighbour-mac", "nonsense"}, {"-neighbour-mac", "52:54:00:00:00"}, {"-neighbour-mac", "52:54:00:00:00:03:04:05"},
		{"-gateway-mac", "52:54-00:00:00:03"}, {"-gateway-mac", "5:54:00:00:00:03"},
		{"-hostile-spray-ports", "1000"}, {"-hostile-spray-ports", "0"}, {"-hostile-dns", "100000"}, {"-hostile-dns", "-1"},
		{"-hostile-aim-count", "1000"}, {"-hostile-aim-count", "0"}, {"-hostile-aim-interval", "1ms"}, {"-hostile-aim-interval", "499ms"},
		{"-hostile-dns-domain", "a b"}, {"-hostile-dns-domain", "a/b"}, {"-hostile-dns-domain", ""},
		{"-hostile-aim-count", "x"}, {"-hostile-aim-interval", "5"},
	} {
		cases = append(cases, append(slices.Clone(hostileArgs), bad...))
	}
	return cases
}

// goConfig prints a Go Config as the driver prints the C one.
func goConfig(c *beacon.Config) string {
	addr := ""
	if c.C2Addr.IsValid() {
		addr = c.C2Addr.Unmap().String()
	}
	var scan []string
	for _, a := range c.Scan {
		scan = append(scan, a.Unmap().String())
	}
	s := fmt.Sprintf("c2=%s port=%d path=%s id=%s interval=%d jitter=%g count=%d retry=%d retries=%d timeout=%d scan_port=%d behave=%s behave_listen=%d c2addr=%s scan=%s hostile=",
		c.C2, c.Port, c.Path, c.ID, c.Interval, c.Jitter, c.Count, c.Retry, c.Retries, c.Timeout, c.ScanPort, c.Behave, c.BehaveListen, addr, strings.Join(scan, ","))
	if h := c.Hostile; h != nil {
		text := func(v interface{ IsValid() bool }) string {
			if !v.IsValid() {
				return ""
			}
			return fmt.Sprint(v)
		}
		s += fmt.Sprintf("%s iface=%s gw=%s gwmac=%s nb=%s nbmac=%s nbc2=%s http=%s aim=%s aimcount=%d aiminterval=%d spray=%s sprayports=%d dns=%d dnsdomain=%s",
			strings.Join(h.Modes, ","), h.Iface, text(h.Gateway), h.GatewayMAC, text(h.Neighbour), h.NeighbourMAC, text(h.NeighbourC2),
			text(h.HTTP), text(h.Aim), h.AimCount, h.AimInterval, text(h.Spray), h.SprayPorts, h.DNSBurst, h.DNSDomain)
	}
	return s
}

// TestHostileFrames decodes the C beacon's hostile frames, which the host
// test builds with policy.c alone and never sends: the same forgeries as
// the Go beacon's (its TestSpoofFramesForgeTheNeighboursSourceAndMAC and
// TestARPFramesClaimTheGatewayAndTheNeighbour), with lengths and checksums
// as gopacket computes them; and no frame at all on a link outside the lab
// or towards a C2 outside the documentation ranges.
func TestHostileFrames(t *testing.T) {
	run := driver(t)
	const attacker, gateway = "52:54:00:00:00:02", "52:54:00:00:00:01"
	decode := func(line string) gopacket.Packet {
		b, err := hex.DecodeString(line)
		if err != nil {
			t.Fatalf("driver said %q", line)
		}
		p := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
		// Serialized again, computing lengths and checksums: the same bytes.
		buf := gopacket.NewSerializeBuffer()
		var ls []gopacket.SerializableLayer
		for _, l := range p.Layers() {
			if sl, ok := l.(gopacket.SerializableLayer); ok {
				ls = append(ls, sl)
			}
		}
		if tcp, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP); ok {
			tcp.SetNetworkLayerForChecksum(p.NetworkLayer())
		}
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), b) {
			t.Errorf("frame %x\nserialized by gopacket %x", b, buf.Bytes())
		}
		return p
	}

	spoof := run(append([]string{"frames", "spoof", attacker, "10.213.1.2/24", gateway}, hostileArgs...)...)
	want := []struct{ mac, src, dst string }{
		{attacker, "10.213.1.3", "198.51.100.18"},
		{"52:54:00:00:00:03", "10.213.1.2", "198.51.100.18"},
		{"52:54:00:00:00:03", "10.213.1.3", "198.51.100.18"},
		{attacker, "2001:db8::ad5:103", "2001:db8::c633:6412"},
		{attacker, "0.0.0.0", "198.51.100.18"},
	}
	if len(spoof) != len(want) || len(beacon.SpoofVariants) != len(want) {
		t.Fatalf("spoof frames: %q", spoof)
	}
	for i, line := range spoof {
		p := decode(line)
		eth, _ := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		tcp, _ := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if eth == nil || p.NetworkLayer() == nil || tcp == nil || p.ErrorLayer() != nil {
			t.Fatalf("frame %d does not decode: %v", i, p)
		}
		src, dst := p.NetworkLayer().NetworkFlow().Endpoints()
		hops := uint8(0)
		switch ip := p.NetworkLayer().(type) {
		case *layers.IPv4:
			hops = ip.TTL
		case *layers.IPv6:
			hops = ip.HopLimit
		}
		if eth.SrcMAC.String() != want[i].mac || eth.DstMAC.String() != gateway || src.String() != want[i].src ||
			dst.String() != want[i].dst || hops != 64 || !tcp.SYN || tcp.ACK || tcp.DstPort != 80 ||
			tcp.SrcPort != layers.TCPPort(47000+i) || tcp.Seq != beacon.SpoofSeq+uint32(i) {
			t.Errorf("frame %d (%s): %v", i, beacon.SpoofVariants[i], p)
		}
	}

	arp := run(append([]string{"frames", "arp", attacker, "10.213.1.2/24", gateway}, hostileArgs...)...)
	claims := []struct{ dst, claimed, target string }{
		{"ff:ff:ff:ff:ff:ff", "10.213.1.1", "10.213.1.1"},
		{"52:54:00:00:00:03", "10.213.1.1", "10.213.1.3"},
		{"ff:ff:ff:ff:ff:ff", "10.213.1.3", "10.213.1.3"},
	}
	if len(arp) != len(claims) {
		t.Fatalf("ARP frames: %q", arp)
	}
	for i, line := range arp {
		p := decode(line)
		eth, _ := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		a, _ := p.Layer(layers.LayerTypeARP).(*layers.ARP)
		if eth == nil || a == nil {
			t.Fatalf("frame %d does not decode: %v", i, p)
		}
		if eth.SrcMAC.String() != attacker || eth.DstMAC.String() != claims[i].dst || a.Operation != layers.ARPReply ||
			net.HardwareAddr(a.SourceHwAddress).String() != attacker || net.IP(a.SourceProtAddress).String() != claims[i].claimed ||
			net.IP(a.DstProtAddress).String() != claims[i].target {
			t.Errorf("frame %d: %v", i, p)
		}
	}

	// Raw frames only on the lab's link, where the gateway and the
	// neighbour are (the Go beacon's TestRawFramesStayOnTheLabLink).
	for _, link := range []string{"192.168.1.2/24", "10.213.2.2/24", "10.0.0.2/7", "172.16.1.2/16", "10.213.1.2/33"} {
		for _, kind := range []string{"spoof", "arp"} {
			if got := run(append([]string{"frames", kind, attacker, link, gateway}, hostileArgs...)...); !strings.HasPrefix(got[0], "error: refusing") {
				t.Errorf("%s frames on %s: %q", kind, link, got)
			}
		}
	}
}

// TestResolvedAddressesAreChecked is the Go beacon's resolve: a name that
// resolves outside the networks is not contacted; -c2-addr wins whatever the
// name resolves to, even when the lookup fails.
func TestResolvedAddressesAreChecked(t *testing.T) {
	run := driver(t)
	for _, c := range []struct {
		resolved string
		args     []string
		want     string
	}{
		{"93.184.216.34", []string{"-c2", "c2.example"}, "refused"},
		{"93.184.216.34,10.213.1.1,172.16.0.1", []string{"-c2", "c2.example"}, "refused"},
		{"fail", []string{"-c2", "c2.example"}, "refused"},
		{"8.8.8.8,10.13.38.2,127.0.0.1", []string{"-c2", "c2.example"}, "10.13.38.2"},
		{"127.0.0.1", []string{"-c2", "c2.example"}, "127.0.0.1"},
		{"10.13.38.2", []string{"-c2", "c2.example", "-c2-addr", "127.0.0.1"}, "127.0.0.1"},
		{"fail", []string{"-c2", "c2.example", "-c2-addr", "198.51.100.2"}, "198.51.100.2"},
		{"8.8.8.8", []string{"-c2", "198.51.100.9"}, "198.51.100.9"},
	} {
		if got := run(append([]string{"pick", c.resolved}, c.args...)...)[0]; got != c.want {
			t.Errorf("%q resolving to %s: C beacon picks %s, want %s", c.args, c.resolved, got, c.want)
		}
	}
}

// TestEveryConnectionIsChecked reads beacon.c, whose networking the host
// never runs: its only three connect calls (TCP in dial, UDP to the
// resolver, UDP to an attack's target) each come after the policy check,
// and nothing sends otherwise; an attack starts only once its order passed
// order_check and the budget (TestMiraiOrdersDecodeAsBotproto,
// TestAttackBudget), and its packets stop at the plan's count and end.
func TestEveryConnectionIsChecked(t *testing.T) {
	b, err := os.ReadFile("beacon.c")
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	for _, bad := range []string{"sendto(", "sendmsg(", "getaddrinfo(", "gethostbyname("} {
		if strings.Contains(src, bad) {
			t.Errorf("beacon.c calls %s", bad)
		}
	}
	if n := strings.Count(src, "connect("); n != 3 {
		t.Errorf("beacon.c has %d connect calls, want the three this test checks", n)
	}
	for fn, guard := range map[string]string{"static int dial_start(": "if (!allowed(a))", "static int udp_open(": "if (!resolver_allowed(ns))",
		"static int attack_open(": "if (!attack_allowed(a))"} {
		i := strings.Index(src, fn)
		if i < 0 {
			t.Fatalf("beacon.c has no %s", fn)
		}
		body := src[i:]
		body = body[:strings.Index(body, "\n}\n")]
		g, c := strings.Index(body, guard), strings.Index(body, "connect(")
		if g < 0 || c < 0 || g > c {
			t.Errorf("%s…: %q must come before connect", fn, guard)
		}
	}
	body := func(fn string) string {
		i := strings.Index(src, fn)
		if i < 0 {
			t.Fatalf("beacon.c has no %s", fn)
		}
		b := src[i:]
		return b[:strings.Index(b, "\n}\n")]
	}
	// The attack: opened in attack_start alone, after the order's checks;
	// sent in attack_step alone, which stops at the plan's packets and end.
	if strings.Count(src, "attack_open(") != 2 {
		t.Error("beacon.c opens an attack socket outside attack_start")
	}
	start := body("static void attack_start(")
	if c, b, o := strings.Index(start, "order_check(o,"), strings.Index(start, "attack_plan_for(o, attack_budget,"),
		strings.Index(start, "attack_open(p.target, p.port,"); c < 0 || b < c || o < b || !strings.Contains(start, "attack_budget -= p.packets;") {
		t.Error("attack_start opens its socket before order_check and the budget, or spends no budget")
	}
	step := body("static int64_t attack_step(")
	for _, bound := range []string{"if (now >= attack.end) {", "if (attack.sent == attack.p.packets)", "attack.next += attack.p.gap_ns;"} {
		if !strings.Contains(step, bound) {
			t.Errorf("attack_step lacks %q", bound)
		}
	}
	if n := strings.Count(src, "send(attack.fd,"); n != 1 || !strings.Contains(step, "send(attack.fd,") {
		t.Error("attack packets are sent outside attack_step")
	}
	// dial's callers pass the policy for what they contact: the hostile
	// modes the documentation ranges alone.
	if !strings.Contains(src, "dial(addr, c->port, c2_allowed,") || !strings.Contains(src, "dial(a, c->scan_port, scan_allowed,") {
		t.Error("beacon.c dials without the C2 or scan policy")
	}
	for _, m := range regexp.MustCompile(`dial(?:_start)?\(([^;]*?), ([a-z0-9_]+_allowed|allowed),`).FindAllStringSubmatch(src, -1) {
		if m[2] != "allowed" && m[2] != "c2_allowed" && m[2] != "scan_allowed" && m[2] != "hostile_doc_allowed" {
			t.Errorf("beacon.c dials %s under %s", m[1], m[2])
		}
		if strings.HasPrefix(m[1], "h->") && m[2] != "hostile_doc_allowed" {
			t.Errorf("beacon.c dials the hostile target %s under %s, not the documentation ranges", m[1], m[2])
		}
	}
	// Raw frames: one packet socket, whose frames come from the builders
	// that refuse a link outside the lab (TestHostileFrames).
	if n := strings.Count(src, "socket(AF_PACKET"); n != 1 {
		t.Errorf("beacon.c opens %d packet sockets, want one (send_frames)", n)
	}
	for _, call := range []string{"spoof_frames(h, &l, gw_mac, frames,", "arp_frames(h, &l, frames,"} {
		if !strings.Contains(src, call) {
			t.Errorf("beacon.c does not build its frames with %s…)", call)
		}
	}
}

// TestBehaveNamesWhatTheGoBeaconNames: -behave DIR renames the process,
// drops a file and writes persistence files named exactly as the Go
// beacon's (the behaviour test asserts the same observables for both),
// with paths joined as Go's filepath.Join joins them.
func TestBehaveNamesWhatTheGoBeaconNames(t *testing.T) {
	run := driver(t)
	dirs := []string{"/var/tmp/talkbox/behave", "/var/tmp/talkbox/behave/", "rel/dir", "/", ".", "a//b/./c/../d", "../x", "/../x"}
	lines := run(append([]string{"behave"}, dirs...)...)
	for i, dir := range dirs {
		want := []string{beacon.ProcessName, filepath.Join(dir, beacon.Dropped)}
		for _, p := range beacon.Persistence {
			want = append(want, filepath.Join(dir, p))
		}
		if got := lines[i]; got != strings.Join(want, " ") {
			t.Errorf("-behave %q:\nC  %s\nGo %s", dir, got, strings.Join(want, " "))
		}
	}
	// The join itself, on the edges of Clean and at random.
	pairs := []string{"", "", "", "x", "x", "", "/", "", "", "/", "a/", "/b", "..", "..", "../..", "a/../../b",
		"/a/b", "../../..", "a/./b/", "./.", "/..", "a", "...", "..b/.c", "a//", "//b//"}
	r := rand.New(rand.NewPCG(3, 5))
	for range 500 {
		for range 2 {
			var b strings.Builder
			for range r.IntN(9) {
				b.WriteByte("a./"[r.IntN(3)])
			}
			pairs = append(pairs, b.String())
		}
	}
	got := run(append([]string{"join"}, pairs...)...)
	for i := 0; i+1 < len(pairs); i += 2 {
		if want := filepath.Join(pairs[i], pairs[i+1]); got[i/2] != want {
			t.Errorf("join(%q, %q): C %q, Go %q", pairs[i], pairs[i+1], got[i/2], want)
		}
	}
}

// TestBehaveStaysInItsDirectory reads beacon.c, whose -behave the host
// never runs: it creates files and directories only at paths joined under
// -behave's directory, changes the mode of the dropped file alone, deletes
// nothing but its own binary, and its one listener contacts nothing.
func TestBehaveStaysInItsDirectory(t *testing.T) {
	b, err := os.ReadFile("beacon.c")
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	calls := func(name string) []string {
		var args []string
		for _, m := range regexp.MustCompile(`[^a-z_]`+regexp.QuoteMeta(name)+`\(([^,;)]*)`).FindAllStringSubmatch(src, -1) {
			args = append(args, strings.TrimSpace(m[1]))
		}
		return args
	}
	for _, c := range []struct {
		call string
		args []string // every call's first argument, in order
	}{
		{"unlink", []string{"self"}},
		{"chmod", []string{"drop"}},
		{"mkdir", []string{"path"}}, // in mkdir_all
		{"mkdir_all", []string{"const char *path", "parent", "c->behave", "dir"}}, // its definition, then calls
		{"write_file", []string{"const char *path", "drop", "path"}},
		{"behave_path", []string{"c->behave", "c->behave", "path"}}, // drop, each persistence file and its directory
		{"bind", []string{"listener", "pkt"}},                       // -behave-listen's; the hostile modes' packet socket (sends only)
		{"rename", nil}, {"renameat", nil}, {"creat", nil}, {"link", nil}, {"symlink", nil}, {"rmdir", nil},
		{"kill", nil}, {"ptrace", nil}, {"fopen", []string{"\"/etc/hosts\"", "\"/etc/resolv.conf\"", "\"/proc/net/arp\""}},
	} {
		if got := calls(c.call); !slices.Equal(got, c.args) {
			t.Errorf("beacon.c: %s( called with %q, want %q", c.call, got, c.args)
		}
	}
	// Files are created by write_file alone; the listener is the one of
	// -behave-listen, on every address of the guest (as Go's ":PORT").
	if n := strings.Count(src, "O_CREAT"); n != 1 {
		t.Errorf("beacon.c opens with O_CREAT %d times, want once (write_file)", n)
	}
	if !strings.Contains(src, "sa.sin_port = htons((uint16_t)c->behave_listen);") || !strings.Contains(src, "htonl(INADDR_ANY)") {
		t.Error("beacon.c's listener is not -behave-listen's port on INADDR_ANY")
	}
	// The child is the beacon again, started under the new name.
	if !strings.Contains(src, `{BEHAVE_NAME, "-behave-child", NULL}`) || strings.Count(src, "execv(") != 1 || !strings.Contains(src, "execv(self, args)") {
		t.Error("beacon.c's child is not its own binary run as -behave-child under BEHAVE_NAME")
	}
}
