package beacon

import "testing"

// TestClockTamperOnlyInATalkboxGuest: -tamper clock sets the clock of the
// machine it runs on, so it acts only under a kernel tb-lease booted (a
// talkbox.net= parameter); the test reads command lines, and never sets a
// clock.
func TestClockTamperOnlyInATalkboxGuest(t *testing.T) {
	for cmdline, want := range map[string]bool{
		"talkbox.net=static talkbox.if=eth0 talkbox.ip=198.51.100.200/24 root=/dev/vda\n": true,
		"loglevel=3 audit=0 talkbox.net=dhcp":                                             true,
		"console=ttyS0 quiet panic=1":                                                     false,
		"console=ttyS0 xtalkbox.net=static":                                               false,
		"":                                                                                false,
		"console=ttyS0 talkbox.netmask=1 talkbox.if=eth0":                                 false,
	} {
		if got := talkboxGuest([]byte(cmdline)); got != want {
			t.Errorf("%q: %v, want %v", cmdline, got, want)
		}
	}
	if _, modes, err := TamperArg([]string{"-tamper", "forge,clock"}); err != nil || len(modes) != 2 || modes[1] != "clock" {
		t.Errorf("-tamper forge,clock: %v %v", modes, err)
	}
}
