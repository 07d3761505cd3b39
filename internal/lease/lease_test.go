package lease

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// The VM paths are covered by cmd/tb-lease's scripts against the real
// libvirtd; these cover the pure parts.

func TestNames(t *testing.T) {
	id := "lease_01M7XX84GEB8BQXN590Y3V1ST9"
	if got := vmName(id); got != "tb-01m7xx84geb8bqxn590y3v1st9" {
		t.Errorf("vmName = %s", got)
	}
	if got := tapName(id); len(got) > 15 || got != "tbxn590y3v1st9" {
		t.Errorf("tapName = %s (%d chars)", got, len(got))
	}
	if macFor(id, 0) != macFor(id, 0) || macFor(id, 0) == macFor(id, 1) || !strings.HasPrefix(macFor(id, 0), "52:54:00:") {
		t.Errorf("macFor not deterministic or not distinct: %s %s", macFor(id, 0), macFor(id, 1))
	}
}

func TestAllocate(t *testing.T) {
	m := &Manager{Cfg: &Config{LabNet: "10.13.37.0/29", Bridge: "br"}}
	id := "lease_01M7XX84GEB8BQXN590Y3V1ST9"
	// A /29 has .1 (gateway) to .6; .2-.9 are reserved for the lab, so
	// nothing is left: exhausted, exit 75.
	_, err := m.allocate(nil, id)
	var ce *fault.Error
	if !errors.As(err, &ce) || ce.Code != fault.ExitTempFail {
		t.Fatalf("a full /29: %v", err)
	}
	m.Cfg.LabNet = "10.13.37.0/28"
	a, err := m.allocate(nil, id)
	if err != nil || a.IP.String() != "10.13.37.10" || a.Gateway.String() != "10.13.37.1" || a.Prefix != 28 {
		t.Fatalf("first address: %+v %v", a, err)
	}
	used := []*records.SandboxLease{{Bridge: "br", IP: "10.13.37.10", MAC: macFor(id, 0)}, {Bridge: "other", IP: "10.13.37.11"}}
	a, err = m.allocate(used, id)
	if err != nil || a.IP.String() != "10.13.37.11" || a.MAC != macFor(id, 1) {
		t.Fatalf("next address/MAC: %+v %v", a, err)
	}
	for i := 10; i < 15; i++ {
		used = append(used, &records.SandboxLease{Bridge: "br", IP: "10.13.37." + string(rune('0'+i/10)) + string(rune('0'+i%10))})
	}
	if _, err := m.allocate(used, id); !errors.As(err, &ce) || ce.Code != fault.ExitTempFail {
		t.Fatalf("broadcast must not be handed out: %v", err)
	}
}

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	c, err := LoadConfig(filepath.Join(dir, "absent.json"), false)
	if err != nil || len(c.Hosts) != 1 || c.Hosts[0].URI != "qemu:///system" || c.Placement != LeastLoaded || c.Bridge != "tb-lab0" {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "absent.json"), true); err == nil {
		t.Error("a missing required config was accepted")
	}
	for _, bad := range []string{`{"hosts":[{"name":"a"}]}`, `{"placement":"random"}`, `{"hosts":[{"name":"a","uri":"x"},{"name":"a","uri":"y"}]}`, `{"lab_net":"nope"}`, `{"hosts":[{"name":"a","uri":"x","accel":"xen"}]}`} {
		p := filepath.Join(dir, "bad.json")
		os.WriteFile(p, []byte(bad), 0o644)
		_, err := LoadConfig(p, true)
		var ce *fault.Error
		if !errors.As(err, &ce) || ce.Code != fault.ExitDataErr {
			t.Errorf("%s: %v, want exit 65", bad, err)
		}
	}
	// The option earlier versions had is refused, saying what replaced it.
	p := filepath.Join(dir, "old.json")
	os.WriteFile(p, []byte(`{"hosts":[{"name":"r","uri":"qemu+tcp://198.51.100.7/system","uncontained":true}]}`), 0o644)
	if _, err := LoadConfig(p, true); fault.Code(err) != fault.ExitDataErr || !strings.Contains(err.Error(), "tb-run worker on that machine") {
		t.Errorf("uncontained: %v", err)
	}
}

func TestFeatures(t *testing.T) {
	img := &records.SandboxImage{Platform: "amd64"}
	if f := missingFeature(img, []string{"static", "interpreter:/lib64/ld-linux-x86-64.so.2", "interpreter:/bin/sh"}); f != "" {
		t.Errorf("glibc amd64 binary: missing %s", f)
	}
	if f := missingFeature(img, []string{"interpreter:/lib/ld-musl-x86_64.so.1"}); f == "" {
		t.Error("musl loader accepted")
	}
	if f := missingFeature(&records.SandboxImage{Platform: "i386"}, []string{"interpreter:/lib64/ld-linux-x86-64.so.2"}); f == "" {
		t.Error("amd64 loader accepted on i386")
	}
}

func TestOwnedLease(t *testing.T) {
	st, err := state.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := &Manager{St: st}
	id := "lease_01M7XX84GEB8BQXN590Y3V1ST9"
	if got, ok := m.ownedLease(m.description(id)); !ok || got != id {
		t.Errorf("own description: %s %v", got, ok)
	}
	for _, d := range []string{"", "talkbox lease " + id + " state /elsewhere", "something else", "talkbox lease ../x state " + st.Root()} {
		if _, ok := m.ownedLease(d); ok {
			t.Errorf("%q counted as ours", d)
		}
	}
}

func saveImage(xml, cookie string, stream []byte) []byte {
	data := append([]byte(xml), 0)
	off := uint32(len(data))
	data = append(data, append([]byte(cookie), 0)...)
	data = append(data, make([]byte, 100)...)
	hdr := make([]byte, saveHeaderSize)
	copy(hdr, saveMagic)
	bo := binary.NativeEndian
	bo.PutUint32(hdr[16:], 2)
	bo.PutUint32(hdr[20:], uint32(len(data)))
	bo.PutUint32(hdr[24:], 1)
	bo.PutUint32(hdr[32:], off)
	return append(append(hdr, data...), stream...)
}

func TestRewriteSaveImage(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "a.save"), filepath.Join(dir, "b.save")
	stream := bytes.Repeat([]byte("QEVM"), 5000)
	os.WriteFile(src, saveImage("<domain><name>old</name></domain>", "<qemu-migration/>", stream), 0o600)
	newXML := "<domain><name>a-much-longer-new-name</name></domain>"
	if err := rewriteSaveImage(src, dst, newXML); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(dst)
	bo := binary.NativeEndian
	dataLen, cookieOff := bo.Uint32(b[20:]), bo.Uint32(b[32:])
	data := b[saveHeaderSize : saveHeaderSize+int(dataLen)]
	if got := string(data[:bytes.IndexByte(data, 0)]); got != newXML {
		t.Errorf("xml = %q", got)
	}
	if c := data[cookieOff:]; !bytes.HasPrefix(c, []byte("<qemu-migration/>\x00")) {
		t.Errorf("cookie = %q", c[:20])
	}
	if bo.Uint32(b[24:]) != 1 || !bytes.Equal(b[saveHeaderSize+int(dataLen):], stream) {
		t.Error("header flags or migration stream changed")
	}
	os.WriteFile(src, []byte("not a save image at all, but long enough for a header............................................"), 0o600)
	var ce *fault.Error
	if err := rewriteSaveImage(src, dst, newXML); !errors.As(err, &ce) || ce.Code != fault.ExitDataErr {
		t.Errorf("garbage: %v", err)
	}
}

// TestFleetHostName: without hosts configured, the local libvirtd takes a
// fleet host's name (TB_HOST, set by tb-run worker); a configuration that
// lists hosts keeps its names.
func TestFleetHostName(t *testing.T) {
	dir := t.TempDir()
	c, err := Options{HostName: "sandbox-07"}.Load(dir)
	if err != nil || len(c.Hosts) != 1 || c.Hosts[0].Name != "sandbox-07" || c.Hosts[0].URI != "qemu:///system" {
		t.Fatalf("default host with a fleet name: %+v %v", c, err)
	}
	os.MkdirAll(filepath.Join(dir, "tb-lease"), 0o755)
	os.WriteFile(filepath.Join(dir, "tb-lease", "config.json"), []byte(`{"hosts":[{"name":"rack1","uri":"qemu:///system"}]}`), 0o644)
	if c, err = (Options{HostName: "sandbox-07"}).Load(dir); err != nil || c.Hosts[0].Name != "rack1" {
		t.Fatalf("configured hosts renamed: %+v %v", c, err)
	}
}
