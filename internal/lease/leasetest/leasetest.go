// Package leasetest provides the fixtures of tb-lease's integration tests:
// a real amd64 image built once per machine with tb-build's own code and
// shared between test processes, and throw-away labs (tb-lease starts guests
// only on a checked lab's bridge).
package leasetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// Spec is the image the tests boot.
const Spec = "debian-bookworm-amd64"

// Root is the machine-wide fixture cache: TB_TEST_IMAGES, default
// $TMPDIR/talkbox-test-images.
func Root() string {
	if d := os.Getenv("TB_TEST_IMAGES"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "talkbox-test-images")
}

// AptCache is the .deb cache tb-build's tests share.
func AptCache() string {
	if d := os.Getenv("TB_TEST_APT_CACHE"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "talkbox-test-apt-cache")
}

// Fixture is a built, verified image in its own state directory.
type Fixture struct {
	State string
	Image *records.SandboxImage
}

// Image returns the amd64 fixture image (see ImageFor).
func Image(ctx context.Context) (*Fixture, error) { return ImageFor(ctx, Spec) }

// ImageFor returns the fixture image of an embedded spec, building it first
// if no valid one is cached. The cache is keyed by the spec's digest and
// image.BuildRevision, so a changed spec or build is built again; a file
// lock makes parallel test processes build each spec once.
func ImageFor(ctx context.Context, specID string) (*Fixture, error) {
	ss, err := image.LoadSpecs("")
	if err != nil {
		return nil, err
	}
	spec, err := ss.Get(specID)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(Root(), fmt.Sprintf("%s-%s-r%d", specID, spec.SHA256()[:16], image.BuildRevision))
	if err := reachable(dir); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, err
	}
	f := &Fixture{State: filepath.Join(dir, "state")}
	if f.Image, err = verified(ctx, f.State, specID); err == nil {
		return f, nil
	}
	os.RemoveAll(f.State)
	if err := build(ctx, f.State, specID); err != nil {
		return nil, fmt.Errorf("building the fixture image %s: %w", specID, err)
	}
	if f.Image, err = verified(ctx, f.State, specID); err != nil {
		return nil, err
	}
	return f, nil
}

// build does what "tb-build build" does, into the state directory dir.
func build(ctx context.Context, dir, specID string) error {
	job, err := image.PrepareBuild(ctx, image.BuildRequest{Spec: specID, URI: virt.DefaultURI, Accel: "auto", CacheDir: AptCache()})
	if err != nil {
		return err
	}
	defer job.Close()
	st, err := state.Open(ctx, dir)
	if err != nil {
		return err
	}
	defer st.Close()
	return job.Run(ctx, st, cmdout.New("tb-build", io.Discard, os.Stderr,
		slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
}

func verified(ctx context.Context, dir, specID string) (*records.SandboxImage, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, err
	}
	st, err := state.Open(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	img, err := image.Active(st, specID)
	if err != nil {
		return nil, err
	}
	// The cache may have moved since the build; the files are where the
	// layout puts them.
	img.Dir = filepath.Join(dir, "images", img.Spec, img.Version)
	pub, err := image.LoadPublicKey(dir)
	if err != nil {
		return nil, err
	}
	if _, probs := image.VerifyDir(img.Dir, pub); len(probs) > 0 {
		return nil, fmt.Errorf("fixture image %s: %s", img.ID, probs[0])
	}
	return img, nil
}

// Install registers the fixture image in a test's state directory (the
// files stay in the cache, read-only backing files of the overlays) and
// copies the cached KVM/TCG probe, so tests do not probe again.
func (f *Fixture) Install(ctx context.Context, stateDir string, opts ...state.Option) error {
	st, err := state.Open(ctx, stateDir, opts...)
	if err != nil {
		return err
	}
	defer st.Close()
	img := *f.Image
	img.Rev = 0
	if err := st.Put(ctx, &img); err != nil {
		return err
	}
	probes, _ := filepath.Glob(filepath.Join(f.State, "virt", "accel-*.json"))
	for _, p := range probes {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		os.MkdirAll(filepath.Join(stateDir, "virt"), 0o755)
		if err := os.WriteFile(filepath.Join(stateDir, "virt", filepath.Base(p)), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// reachable creates dir and makes its parents searchable by libvirt's
// unprivileged QEMU.
func reachable(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				return err
			}
		}
	}
	return nil
}

// Reachable makes dir's parents searchable by libvirt's QEMU.
func Reachable(dir string) error { return reachable(dir) }

// Cleanup destroys the domains of every lease in a state directory (on
// whichever host), whatever their state: what a failed test leaves.
func Cleanup(stateDir string, opts ...state.Option) {
	ctx := context.Background()
	st, err := state.Open(ctx, stateDir, opts...)
	if err != nil {
		return
	}
	defer st.Close()
	ids, _ := st.List(records.KindLease)
	if len(ids) == 0 {
		return
	}
	conns := map[string]*virt.Libvirt{}
	for _, id := range ids {
		var l records.SandboxLease
		if st.Get(id, &l) != nil || l.VMName == "" {
			continue
		}
		c, ok := conns[l.ConnectURI]
		if !ok {
			c, _ = virt.Connect(l.ConnectURI)
			conns[l.ConnectURI] = c
		}
		if c != nil {
			c.Destroy(ctx, l.VMName)
		}
	}
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

// Host is a second libvirt host: a libvirtd in its own network and mount
// namespaces (private /run/libvirt, /var/lib/libvirt, /var/cache/libvirt
// and /etc/libvirt), listening on TCP without authentication on a veth
// address in 203.0.113.0/24, so it is reached as qemu+tcp://ADDR/system.
// Guests there attach to a bridge of the same name inside its namespace.
type Host struct {
	URI string
	// SocketURI reaches the same libvirtd on its Unix socket, as a tb-lease
	// running on that host (in its namespaces) would: qemu:///system
	// there.
	SocketURI string
	// NS is the host's network namespace; HostIP and NSIP the two ends of
	// the veth between this machine and it.
	NS           string
	HostIP, NSIP string
	ns           string
	veth         string
	work         string
	cmd          *exec.Cmd
	// exited receives the libvirtd's end.
	exited chan error
}

// SecondHost starts the second libvirtd and waits until it answers.
func SecondHost(ctx context.Context, bridge string) (*Host, error) {
	var b [3]byte
	rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	sub := int(b[0]) % 64 * 4
	hostIP, nsIP := fmt.Sprintf("203.0.113.%d", sub+1), fmt.Sprintf("203.0.113.%d", sub+2)
	h := &Host{URI: "qemu+tcp://" + nsIP + "/system", ns: "tbl2" + tag, veth: "tbl2h" + tag}
	h.NS, h.HostIP, h.NSIP = h.ns, hostIP, nsIP
	var err error
	if h.work, err = os.MkdirTemp("", "tb-lease-host2."); err != nil {
		return nil, err
	}
	h.SocketURI = "qemu+unix:///system?socket=" + filepath.Join(h.work, "run", "libvirt-sock")
	fail := func(err error) (*Host, error) {
		h.Stop()
		return nil, err
	}
	run := func(args ...string) error {
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %s", strings.Join(args, " "), strings.TrimSpace(string(out)))
		}
		return nil
	}
	nsIf := "tbl2n" + tag
	for _, c := range [][]string{
		{"ip", "netns", "add", h.ns},
		{"ip", "link", "add", h.veth, "type", "veth", "peer", "name", nsIf},
		{"ip", "link", "set", nsIf, "netns", h.ns},
		{"ip", "addr", "add", hostIP + "/30", "dev", h.veth},
		{"ip", "link", "set", h.veth, "up"},
		{"ip", "-n", h.ns, "addr", "add", nsIP + "/30", "dev", nsIf},
		{"ip", "-n", h.ns, "link", "set", nsIf, "up"},
		{"ip", "-n", h.ns, "link", "set", "lo", "up"},
		{"ip", "-n", h.ns, "link", "add", bridge, "type", "bridge"},
		{"ip", "-n", h.ns, "link", "set", bridge, "up"},
		{"cp", "-a", "/etc/libvirt/.", filepath.Join(h.work, "etc")},
		// QEMU's capabilities, probed per emulator: without the host's
		// cache the new libvirtd spends most of a minute probing them.
		{"cp", "-a", "/var/cache/libvirt/.", filepath.Join(h.work, "cache")},
	} {
		if c[0] == "cp" {
			os.MkdirAll(c[3], 0o755)
		}
		if err := run(c...); err != nil {
			return fail(err)
		}
	}
	for _, d := range []string{"lib", "run"} {
		os.MkdirAll(filepath.Join(h.work, d), 0o755)
	}
	os.RemoveAll(filepath.Join(h.work, "etc", "qemu", "networks", "autostart"))
	conf := fmt.Sprintf("listen_tls = 0\nlisten_tcp = 1\nauth_tcp = \"none\"\nlisten_addr = %q\n", nsIP)
	if err := os.WriteFile(filepath.Join(h.work, "etc", "libvirtd.conf"), []byte(conf), 0o644); err != nil {
		return fail(err)
	}
	// No virtlogd in the private /run/libvirt: QEMU writes its own logs.
	qc, _ := os.ReadFile(filepath.Join(h.work, "etc", "qemu.conf"))
	if err := os.WriteFile(filepath.Join(h.work, "etc", "qemu.conf"), append(qc, "\nstdio_handler = \"file\"\n"...), 0o644); err != nil {
		return fail(err)
	}
	script := fmt.Sprintf(`mount --bind %[1]s/etc /etc/libvirt && mount --bind %[1]s/run /run/libvirt && mount --bind %[1]s/lib /var/lib/libvirt && mount --bind %[1]s/cache /var/cache/libvirt && exec libvirtd --listen -p %[1]s/libvirtd.pid -f /etc/libvirt/libvirtd.conf`, h.work)
	h.cmd = exec.Command("ip", "netns", "exec", h.ns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	logf, err := os.Create(filepath.Join(h.work, "libvirtd.log"))
	if err != nil {
		return fail(err)
	}
	h.cmd.Stdout, h.cmd.Stderr = logf, logf
	if err := h.cmd.Start(); err != nil {
		logf.Close()
		return fail(err)
	}
	logf.Close()
	h.exited = make(chan error, 1)
	go func() { h.exited <- h.cmd.Wait() }()
	// libvirtd gives no readiness signal here; its TCP socket answering is.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for {
		if c, err := virt.Connect(h.URI); err == nil {
			c.Close()
			return h, nil
		}
		select {
		case err := <-h.exited:
			h.cmd = nil
			log, _ := os.ReadFile(filepath.Join(h.work, "libvirtd.log"))
			return fail(fmt.Errorf("second libvirtd exited (%v): %s", err, log))
		case <-deadline:
			return fail(fmt.Errorf("second libvirtd did not answer at %s within 30s", h.URI))
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-tick.C:
		}
	}
}

// Stop destroys the host's domains, stops its libvirtd and removes its
// namespace, veth and files.
func (h *Host) Stop() {
	if h.cmd != nil && h.cmd.Process != nil {
		if c, err := virt.Connect(h.URI); err == nil {
			ctx := context.Background()
			if doms, err := c.Domains(ctx); err == nil {
				for _, d := range doms {
					c.Destroy(ctx, d.Name)
				}
			}
			c.Close()
		}
		// libvirtd is exec'ed in place of the sh the command started.
		h.cmd.Process.Signal(unix.SIGTERM)
		select {
		case <-h.exited:
		case <-time.After(10 * time.Second):
			h.cmd.Process.Kill()
		}
	}
	exec.Command("ip", "link", "del", h.veth).Run()
	exec.Command("ip", "netns", "del", h.ns).Run()
	if h.work != "" {
		os.RemoveAll(h.work)
	}
}
