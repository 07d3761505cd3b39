package virt

import "testing"

// TestLocalURI: the gdbstub's socket is a file of this machine, so only a
// libvirtd here may have its guests' timers re-armed.
func TestLocalURI(t *testing.T) {
	for uri, want := range map[string]bool{
		"": true, "qemu:///system": true, "qemu+unix:///system?socket=/run/x/libvirt-sock": true,
		"qemu+tcp://203.0.113.2/system": false, "qemu+ssh://root@host/system": false, "system": false,
	} {
		if got := LocalURI(uri); got != want {
			t.Errorf("LocalURI(%q) = %v, want %v", uri, got, want)
		}
	}
}

// TestQEMUOwner: the socket's directory is given to the user QEMU runs
// as, read from the live definition's DAC label.
func TestQEMUOwner(t *testing.T) {
	x := `<domain><seclabel type='dynamic' model='apparmor'><label>libvirt-x</label></seclabel>` +
		`<seclabel type='dynamic' model='dac' relabel='yes'><label>+64055:+108</label></seclabel></domain>`
	if uid, gid, err := qemuOwner(x); err != nil || uid != 64055 || gid != 108 {
		t.Errorf("qemuOwner: %d:%d, %v", uid, gid, err)
	}
	if uid, gid, err := qemuOwner(`<domain/>`); err != nil || uid != 0 || gid != 0 {
		t.Errorf("qemuOwner without a label: %d:%d, %v", uid, gid, err)
	}
	if _, _, err := qemuOwner(`<domain><seclabel model='dac'><label>qemu</label></seclabel></domain>`); err == nil {
		t.Error("qemuOwner took a label that is not +UID:+GID")
	}
}
