package leasereport_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/leasereport"
)

// chromium is Debian's chromium package, which scripts/deps.sh installs.
const chromium = "/usr/bin/chromium"

// chromiumRun is what one headless run left: its output (the DOM with
// --dump-dom), its log (console messages among them) and its network log.
type chromiumRun struct {
	stdout, stderr, netlog []byte
}

// runChromium opens the page at path in headless Chromium with extra
// flags (--screenshot=…, --dump-dom), logging every network request the
// browser makes. Name resolution maps every host to nothing, so that a
// page that did ask for something could not reach it from any host.
func runChromium(t *testing.T, path string, extra ...string) chromiumRun {
	t.Helper()
	dir := t.TempDir()
	netlog := filepath.Join(dir, "netlog.json")
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND",
		"--user-data-dir=" + filepath.Join(dir, "profile"), "--enable-logging=stderr", "--v=0", "--log-net-log=" + netlog},
		extra...)
	args = append(args, (&url.URL{Scheme: "file", Path: path}).String())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", chromium, err, stderr.Bytes())
	}
	nl, err := os.ReadFile(netlog)
	if err != nil {
		t.Fatal(err)
	}
	return chromiumRun{stdout: stdout.Bytes(), stderr: stderr.Bytes(), netlog: nl}
}

// networkProblems lists what the page tried to load: every request in the
// network log that the page made (its initiator is the page's origin,
// where the browser's own requests, its update and account checks, have
// none) for anything but a local URL, and every load the page's
// Content-Security-Policy blocked (a console message).
func networkProblems(run chromiumRun) ([]string, error) {
	var nl struct {
		Constants struct {
			LogEventTypes map[string]int `json:"logEventTypes"`
			LogEventPhase map[string]int `json:"logEventPhase"`
		} `json:"constants"`
		Events []struct {
			Type   int `json:"type"`
			Phase  int `json:"phase"`
			Params struct {
				URL       string `json:"url"`
				Initiator string `json:"initiator"`
			} `json:"params"`
		} `json:"events"`
	}
	if err := json.Unmarshal(run.netlog, &nl); err != nil {
		return nil, fmt.Errorf("network log: %w", err)
	}
	start, ok := nl.Constants.LogEventTypes["URL_REQUEST_START_JOB"]
	begin, ok2 := nl.Constants.LogEventPhase["PHASE_BEGIN"]
	if !ok || !ok2 {
		return nil, fmt.Errorf("network log without URL_REQUEST_START_JOB events or PHASE_BEGIN")
	}
	var out []string
	for _, e := range nl.Events {
		if e.Type != start || e.Phase != begin {
			continue
		}
		u, err := url.Parse(e.Params.URL)
		if err != nil {
			return nil, err
		}
		switch {
		case u.Scheme == "file" || u.Scheme == "data" || u.Scheme == "about" || u.Scheme == "chrome":
		case e.Params.Initiator == "not an origin":
			// the browser's own (its update and account checks)
		default:
			out = append(out, fmt.Sprintf("the page requested %s (initiator %q)", e.Params.URL, e.Params.Initiator))
		}
	}
	for _, l := range strings.Split(string(run.stderr), "\n") {
		if strings.Contains(l, "Content Security Policy") {
			out = append(out, "the page's policy blocked a load: "+l)
		}
	}
	return out, nil
}

func hexColour(s string) color.RGBA {
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "#"), 16, 32)
	if err != nil {
		panic(s)
	}
	return color.RGBA{uint8(v >> 16), uint8(v >> 8), uint8(v), 0xff}
}

func rgba(c color.Color) color.RGBA {
	r, g, b, a := c.RGBA()
	return color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), uint8(a >> 8)}
}

// runs finds the rows of im holding a horizontal run of at least minRun
// pixels of colour c.
func runs(im image.Image, c color.RGBA, minRun int) (rows []int) {
	b := im.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		n := 0
		for x := b.Min.X; x < b.Max.X; x++ {
			if rgba(im.At(x, y)) == c {
				if n++; n == minRun {
					rows = append(rows, y)
					break
				}
			} else {
				n = 0
			}
		}
	}
	return rows
}

// TestReportInChromium renders the two-cycle lease's report in headless
// Chromium as an analyst would open it: the screenshot shows the timeline
// and the check-ins drawn, the DOM has the sections and their labels and
// holds the hostile strings as text, and the page makes no network
// request. TB_REPORT_SCREENSHOT=PATH keeps the screenshot (docs/report.png;
// a relative PATH is from the repository's root).
func TestReportInChromium(t *testing.T) {
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("%s: %v: install it with: apt-get install -y chromium (scripts/deps.sh)", chromium, err)
	}
	st, b := twoCycles(t)
	r := collect(t, st, leasereport.Target{Lease: b.Lease})
	var page bytes.Buffer
	if err := leasereport.WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "report.html")
	if err := os.WriteFile(path, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	shot := filepath.Join(dir, "report.png")
	run := runChromium(t, path, "--screenshot="+shot, "--window-size=1280,2400", "--hide-scrollbars")
	problems, err := networkProblems(run)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("screenshot run: %s", p)
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	im, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if keep := os.Getenv("TB_REPORT_SCREENSHOT"); keep != "" {
		if !filepath.IsAbs(keep) {
			keep = filepath.Join("..", "..", keep)
		}
		data, err := os.ReadFile(shot)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keep, data, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot kept in %s", keep)
	}
	checkScreenshot(t, im)

	dom := runChromium(t, path, "--dump-dom")
	problems, err = networkProblems(dom)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("DOM run: %s", p)
	}
	for _, p := range pageProblems(string(dom.stdout)) {
		t.Errorf("DOM: %s", p)
	}
	for _, label := range []string{`aria-label="timeline: cycles coloured by outcome, allow-list revisions as markers, lease health"`,
		`aria-label="check-ins per hour to 198.51.100.18:80/tcp"`, `aria-label="check-ins per hour to each C2"`,
		`aria-label="allow-list history"`, `aria-label="inter-arrival histogram of the check-ins to 203.0.113.50:443/tcp"`,
		`&lt;script&gt;alert(1)&lt;/script&gt;`} {
		if !bytes.Contains(dom.stdout, []byte(label)) {
			t.Errorf("the DOM has no %s", label)
		}
	}
	// The allow-list history is drawn: a row per event.
	if n := bytes.Count(dom.stdout, []byte(`<span class="action a-`)); n != len(r.Events) {
		t.Errorf("the DOM has %d allow-list events, the report %d", n, len(r.Events))
	}

	// The checks see a page that loads something: an image from off the
	// page is refused by the page's policy (and said so on the console);
	// without the policy, the request is in the network log.
	t.Run("detects loads", func(t *testing.T) {
		img := `<body><img src="http://192.0.2.1/x.png" alt="">`
		withCSP := strings.Replace(page.String(), "<body>", img, 1)
		noCSP := strings.Replace(withCSP, `http-equiv="Content-Security-Policy"`, `name="no-policy"`, 1)
		for _, c := range []struct{ name, html, want string }{
			{"policy", withCSP, "the page's policy blocked a load"},
			{"no policy", noCSP, `the page requested http://192.0.2.1/x.png (initiator "null")`},
		} {
			p := filepath.Join(t.TempDir(), "loads.html")
			if err := os.WriteFile(p, []byte(c.html), 0o644); err != nil {
				t.Fatal(err)
			}
			problems, err := networkProblems(runChromium(t, p, "--dump-dom"))
			if err != nil {
				t.Fatal(err)
			}
			if all := strings.Join(problems, "\n"); !strings.Contains(all, c.want) || !strings.Contains(all, "http://192.0.2.1/x.png") {
				t.Errorf("%s: the image from off the page is not seen as it should (%s): %q", c.name, c.want, problems)
			}
		}
	})
}

// checkScreenshot finds the timeline by its bars (the colour of completed
// cycles, which nothing else on the page has, in long runs) and checks
// that it is drawn: the bars, the lease's health band and the revision
// markers are there, in many colours; below it, the check-in charts have
// answered and sinkholed bars.
func checkScreenshot(t *testing.T, im image.Image) {
	t.Helper()
	bars := runs(im, hexColour(leasereport.OutcomeColour["completed"]), 100)
	if len(bars) < 10 {
		t.Fatalf("the screenshot has %d rows of completed cycles' bars", len(bars))
	}
	top, bottom := bars[0]-60, bars[len(bars)-1]+60
	region := image.Rect(0, max(top, 0), im.Bounds().Dx(), min(bottom, im.Bounds().Dy()))
	colours := map[color.RGBA]int{}
	nonWhite := 0
	for y := region.Min.Y; y < region.Max.Y; y++ {
		for x := region.Min.X; x < region.Max.X; x++ {
			c := rgba(im.At(x, y))
			colours[c]++
			if c != (color.RGBA{0xff, 0xff, 0xff, 0xff}) {
				nonWhite++
			}
		}
	}
	area := region.Dx() * region.Dy()
	if len(colours) < 8 || nonWhite < area/20 {
		t.Errorf("timeline region %v: %d colours, %d of %d pixels not white", region, len(colours), nonWhite, area)
	}
	for what, c := range map[string]string{"health band": leasereport.HealthColour["healthy"], "promote marker": leasereport.CauseColour["promote"],
		"approve marker": leasereport.CauseColour["approve"], "expire marker": leasereport.CauseColour["expire"]} {
		if colours[hexColour(c)] < 20 {
			t.Errorf("timeline: the %s (%s) is not drawn: %d pixels", what, c, colours[hexColour(c)])
		}
	}
	for what, c := range map[string]string{"answered": leasereport.Answered, "sinkholed": leasereport.Sinkholed} {
		rows := runs(im, hexColour(c), 50)
		if len(rows) < 10 || rows[0] < bottom {
			t.Errorf("check-ins: %d rows of %s bars below the timeline (y %d)", len(rows), what, bottom)
		}
	}
}
