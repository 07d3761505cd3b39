package clitest

// The pipes the documentation shows are a contract between the seven tools:
// this file runs every one of them. It lives here, beside the helpers all
// the tools' CLI tests share, because a pipe belongs to no one tool: it
// builds all seven, reads README.md, the man pages, docs/guide and every command's
// --help, and checks each pipe against one table of what each stage reads
// and prints (stages, below).

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/elftest"
	"github.com/talkbox-sandbox/talkbox/internal/leasereport/reporttest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Line kinds of a stage's input or output that are not records.
const (
	pathLine = "path" // a file name, one a line (find's output; tb-plan and tb-parse take them)
	anyLine  = "*"    // anything: jq reads it, a text report prints it
)

// stage is what one command of a pipe reads on stdin and prints. The tools
// declare no such lists themselves (cli.Tool.Kinds is only what "list"
// shows), so they are declared once here, and every pipe the test can run
// checks the declaration against what the stage really printed.
type stage struct {
	// reads are the kinds it uses from stdin; nil: it does not read stdin.
	reads []string
	// passesOver: records of other kinds are skipped, not refused.
	passesOver bool
	prints     []string
	// needs says what the stage needs that this test cannot give it (a
	// running VM, a capture daemon, the lab's live firewall), "" if
	// nothing: a pipe with such a stage is checked by kinds only.
	needs func(words []string) string
}

func always(why string) func([]string) string { return func([]string) string { return why } }

// stages are keyed by the program and its command as typed ("tb-run" is
// tb-run's default command, the cycle). A pipe with a stage not here fails
// the test: declare it, with the code it is read from.
var stages = map[string]stage{
	// tb-plan: paths, sample sha256s or sample records on stdin (plan.Ingest).
	"tb-plan":      {reads: []string{pathLine, records.KindSample}, prints: []string{records.KindSample, records.KindPlan}},
	"tb-plan list": {prints: []string{records.KindSample, records.KindPlan}},
	"tb-plan get":  {prints: []string{records.KindSample, records.KindPlan}},
	// lease.ReadPlan takes the first plan record and skips the others;
	// acquire prints the lease (tb-lease printRecords).
	"tb-lease acquire": {reads: []string{records.KindPlan}, passesOver: true, prints: []string{records.KindLease},
		needs: always("boots a VM")},
	// startCmd.Run takes its lease from --lease or --iface only.
	"tb-capture start":  {reads: []string{records.KindLease, records.KindCapture}, passesOver: true, prints: []string{records.KindCapture}, needs: always("captures on a running lease's tap")},
	"tb-capture rotate": {prints: []string{records.KindArtifact}, needs: always("rotates a running capture daemon's file")},
	// tb-run's fromStdin: the first plan, and a lease or a capture's lease;
	// printCycle prints the cycle, its execution and its analysis.
	"tb-run": {reads: []string{records.KindPlan, records.KindLease, records.KindCapture}, passesOver: true,
		prints: []string{records.KindCycle, records.KindExecution, records.KindAnalysis}, needs: always("runs the sample in a lease's VM")},
	// submitCmd.Run: plan records; "samples and other records of the pipeline pass by".
	"tb-run submit": {reads: []string{records.KindPlan}, passesOver: true, prints: []string{records.KindCycle}},
	"tb-run watch":  {prints: []string{records.KindEvent}},
	// --format json prints the report's line kinds; text, html, misp and
	// stix are documents: only jq or a file may follow.
	"tb-run report": {prints: []string{anyLine}},
	// parse.readStdin: artifact records or paths, one a line.
	"tb-parse":       {reads: []string{records.KindArtifact, pathLine}, prints: []string{records.KindArtifact, records.KindObservable}},
	"tb-parse list":  {prints: []string{records.KindObservable}},
	"tb-parse get":   {prints: []string{records.KindObservable, records.KindArtifact}},
	"tb-parse flows": {prints: []string{records.LineFlowConn}},
	// allowlist.ReadObservables: observables; other kinds are counted in
	// the log and passed over.
	"tb-allow promote": {reads: []string{records.KindObservable}, passesOver: true,
		prints: []string{records.KindRevision, records.LineAllowApplied},
		needs: func(words []string) string {
			if slices.Contains(words, "--no-apply") || slices.Contains(words, "--dry-run") {
				return ""
			}
			return "applies the revision to the lab's live firewall"
		}},
	"tb-build list": {prints: []string{records.KindImage, records.KindBuild}},
	"tb-build get":  {prints: []string{records.KindImage, records.KindBuild}},
	"find":          {prints: []string{pathLine}},
	"jq":            {reads: []string{anyLine}, prints: []string{anyLine}},
}

// stageKey finds a stage's declaration: the program and up to two command
// words, longest first ("tb-capture rotate", then "tb-capture").
func stageKey(words []string) (string, stage, bool) {
	for n := min(3, len(words)); n >= 1; n-- {
		if n > 1 && strings.HasPrefix(words[n-1], "-") {
			continue
		}
		k := strings.Join(words[:n], " ")
		if s, ok := stages[k]; ok {
			return k, s, true
		}
	}
	return "", stage{}, false
}

// docLine is a shell line the documentation shows, and where.
type docLine struct{ where, text string }

var (
	fence      = regexp.MustCompile("^\\s*```")
	inlineCode = regexp.MustCompile("`([^`]+)`")
	boldSpan   = regexp.MustCompile(`\*\*(tb-[^*]+)\*\*`)
	arrowNote  = regexp.MustCompile(`\s+->\s.*$`)
)

// markdownLines returns the shell lines of a README or man page: fenced and
// indented code, and inline code and bold spans that start with a tool.
// A code line that starts with "|" continues the one before it (the loop
// in README), and "-> what it prints" notes are dropped.
func markdownLines(name string, text []byte) []docLine {
	var out []docLine
	inFence := false
	for i, l := range strings.Split(string(text), "\n") {
		where := fmt.Sprintf("%s:%d", name, i+1)
		if fence.MatchString(l) {
			inFence = !inFence
			continue
		}
		code := inFence
		if !code && strings.HasPrefix(l, "    ") {
			// Indented: code in the man pages' EXAMPLES, but also the
			// body of a definition list; only a line that starts with a
			// program is taken as code.
			first, _, _ := strings.Cut(strings.TrimSpace(l), " ")
			_, _, code = stageKey([]string{first})
			code = code || strings.HasPrefix(first, "tb-")
		}
		if code {
			s := strings.TrimSpace(arrowNote.ReplaceAllString(l, ""))
			if strings.HasPrefix(s, "|") && len(out) > 0 && out[len(out)-1].where != "" {
				out[len(out)-1].text += " " + s
				continue
			}
			if s != "" {
				out = append(out, docLine{where, s})
			}
			continue
		}
		for _, m := range inlineCode.FindAllStringSubmatch(l, -1) {
			out = append(out, docLine{where, m[1]})
		}
		for _, m := range boldSpan.FindAllStringSubmatch(l, -1) {
			out = append(out, docLine{where, m[1]})
		}
	}
	return out
}

var (
	helpCommand = regexp.MustCompile(`^  ([a-z][a-z0-9-]*(?: [a-z][a-z0-9-]*)*)\s{2,}\S`)
)

// helpLines returns the examples every command's --help prints: the
// tool's, and those of each command (and command group) its help lists.
func helpLines(t *testing.T, bin, tool string) []docLine {
	help := func(args ...string) string {
		out, err := exec.Command(filepath.Join(bin, tool), append(args, "--help")...).Output()
		if err != nil {
			t.Fatalf("%s %s --help: %v", tool, strings.Join(args, " "), err)
		}
		return string(out)
	}
	top := help()
	cmds := map[string]bool{"": true}
	inCmds := false
	for _, l := range strings.Split(top, "\n") {
		switch {
		case l == "Commands:":
			inCmds = true
		case l == "" || !strings.HasPrefix(l, " "):
			inCmds = false
		case inCmds:
			if m := helpCommand.FindStringSubmatch(l); m != nil {
				words := strings.Fields(m[1])
				for n := 1; n <= len(words); n++ {
					cmds[strings.Join(words[:n], " ")] = true
				}
			}
		}
	}
	var out []docLine
	for _, c := range slices.Sorted(maps.Keys(cmds)) {
		text := top
		if c != "" {
			text = help(strings.Fields(c)...)
		}
		_, ex, ok := strings.Cut(text, "\nExamples:\n")
		if !ok {
			continue
		}
		for _, l := range strings.Split(ex, "\n") {
			if s := strings.TrimSpace(l); s != "" {
				out = append(out, docLine{strings.Join(append([]string{tool}, strings.Fields(c+" --help")...), " "), s})
			}
		}
	}
	return out
}

// shellPipe is one pipeline of a shell line: its commands' words (quotes
// removed, nothing expanded).
type shellPipe [][]string

// parsedLine is a shell line's pipelines: those at its top level and those
// inside $(...); top is the top level's pipe (nil if it has none), whose
// "|" are at the byte offsets bars.
type parsedLine struct {
	pipes []shellPipe
	top   shellPipe
	bars  []int
}

// parseShell splits a one-line shell command into its pipelines, honouring
// quotes and command substitution. Redirections and comments are dropped.
func parseShell(line string) (parsedLine, error) {
	var (
		p        parsedLine
		cur      shellPipe
		words    []string
		word     strings.Builder
		inWord   bool
		redirect bool
		quote    byte
	)
	endWord := func() {
		if inWord && !redirect {
			words = append(words, word.String())
		}
		if inWord {
			redirect = false
		}
		word.Reset()
		inWord = false
	}
	endCmd := func() {
		endWord()
		if len(words) > 0 {
			cur = append(cur, words)
		}
		words = nil
	}
	var err error
	endPipe := func() {
		endCmd()
		if len(cur) > 1 {
			if p.top != nil {
				err = fmt.Errorf("more than one pipe in a line")
			}
			p.top = cur
		}
		if len(cur) > 0 {
			p.pipes = append(p.pipes, cur)
		}
		cur = nil
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				word.WriteByte(c)
			}
		case c == '$' && i+1 < len(line) && line[i+1] == '(' && quote != '\'':
			end, err := closingParen(line, i+2)
			if err != nil {
				return p, err
			}
			inner, err := parseShell(line[i+2 : end])
			if err != nil {
				return p, err
			}
			p.pipes = append(p.pipes, inner.pipes...)
			word.WriteString(line[i : end+1])
			inWord = true
			i = end
		case c == '\\' && i+1 < len(line):
			// An escaped character: "\|" in a markdown table's code.
			i++
			word.WriteByte(line[i])
			inWord = true
		case quote == '"':
			if c == '"' {
				quote = 0
			} else {
				word.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == ' ' || c == '\t':
			endWord()
		case c == '|' && i+1 < len(line) && line[i+1] == '|', c == '&' && i+1 < len(line) && line[i+1] == '&':
			endPipe()
			i++
		case c == ';' || c == '&':
			endPipe()
		case c == '|':
			endCmd()
			p.bars = append(p.bars, i)
		case c == '>' || c == '<':
			endWord()
			redirect = true
		case c == '#' && !inWord:
			endPipe()
			return p, err
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return p, fmt.Errorf("unclosed %c", quote)
	}
	endPipe()
	return p, err
}

// closingParen is the offset of the ")" that closes a "$(" whose content
// starts at from.
func closingParen(s string, from int) (int, error) {
	depth, quote := 1, byte(0)
	for i := from; i < len(s); i++ {
		switch c := s[i]; {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '(':
			depth++
		case c == ')':
			if depth--; depth == 0 {
				return i, nil
			}
		}
	}
	return 0, fmt.Errorf("unclosed $(")
}

// checkKinds checks that each stage of a pipe reads stdin, uses at least
// one kind the stage before prints, and uses or passes over all of them.
func checkKinds(pipe shellPipe) error {
	for i := 1; i < len(pipe); i++ {
		ka, a, _ := stageKey(pipe[i-1])
		kb, b, _ := stageKey(pipe[i])
		if b.reads == nil {
			return fmt.Errorf("%s does not read stdin: what %s prints (%s) is lost", kb, ka, strings.Join(a.prints, ", "))
		}
		used := false
		for _, k := range a.prints {
			switch {
			case slices.Contains(b.reads, anyLine) || slices.Contains(b.reads, k):
				used = true
			case k == anyLine || k == pathLine || !b.passesOver:
				return fmt.Errorf("%s prints %s lines, which %s neither uses (%s) nor passes over", ka, k, kb, strings.Join(b.reads, ", "))
			}
		}
		if !used {
			return fmt.Errorf("%s uses none of what %s prints (%s)", kb, ka, strings.Join(a.prints, ", "))
		}
	}
	return nil
}

// fixture is a state directory and the files the documented pipes name.
type fixture struct {
	dir  string
	env  []string
	vars map[string]string // the placeholders' values
}

// placeholders are the words the documentation writes for an ID or a
// path, and the variable each stands for.
var placeholders = map[string]string{
	"L": "L", "LEASE": "L", "lease_01JD...": "L",
	"C": "C", "CYCLE": "C", "cycle_01JD...": "C",
	"P": "P", "PLAN": "P",
	"REV": "REV", "REV2": "REV2",
	"capture_01JD...": "CAPTURE",
	"/srv/in":         "SAMPLES",
}

var shellWord = regexp.MustCompile(`\S+`)

// expand writes the placeholder words of a line as the variables they
// stand for.
func expand(line string) string {
	return shellWord.ReplaceAllStringFunc(line, func(w string) string {
		if v, ok := placeholders[w]; ok {
			return `"$` + v + `"`
		}
		return w
	})
}

func newFixture(t *testing.T, bin string) *fixture {
	ctx := context.Background()
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	// A lease's story as tb-run's post-processing leaves it: the sample,
	// its plan, two cycles with captures, flow logs, observables (TLS,
	// scans among them), allow-list revisions and analyses.
	st, clk, err := reporttest.Open(ctx, stateDir)
	if err != nil {
		t.Fatal(err)
	}
	built, err := reporttest.Build(ctx, st, clk, reporttest.TwoCycles())
	if err != nil {
		t.Fatal(err)
	}
	var img records.SandboxImage
	records.Init(&img, records.KindImage, clk.Now())
	img.Spec, img.Version, img.Platform, img.Status = "debian-bookworm-amd64", "1.0.0+build.1", "amd64", records.ImageActive
	if err := st.Create(ctx, &img); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	files := map[string][]byte{
		"samples/sample.elf": elftest.Build(elftest.Spec{Machine: 62, Bits: 64}),
		"sample.elf":         elftest.Build(elftest.Spec{Machine: 62, Bits: 64}),
		"bot.mips":           elftest.Build(elftest.Spec{Machine: 8, Bits: 32, Big: true}),
		// A machine no profile knows: a plan that is not runnable.
		"odd.elf":     elftest.Build(elftest.Spec{Machine: 0x1234, Bits: 64}),
		"policy.json": []byte(`{"documentation": true}` + "\n"),
	}
	pcap := beaconCapture(t, false)
	files["capture.pcap"] = pcap
	files["big.pcapng"] = beaconCapture(t, true)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(pcap)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	files["window.pcap.gz"] = gz.Bytes()
	for name, src := range map[string]string{
		"conn.log": "../decode/zeek/testdata/conn.log",
		"dns.log":  "../decode/zeek/testdata/dns.log",
		"eve.json": "../decode/eve/testdata/eve.json",
	} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	for name, b := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f := &fixture{dir: dir, vars: map[string]string{
		// The first cycle: the one whose sample beacons over TLS on 443.
		"L": built.Lease, "C": built.Cycles[0], "P": built.Plan, "SHA256": built.SampleSHA256,
		"REV": built.Revisions[0], "REV2": built.Revisions[len(built.Revisions)-1], "CAPTURE": built.Capture,
		"SAMPLES": filepath.Join(dir, "samples"),
	}}
	f.env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "TB_STATE="+stateDir,
		"TB_PROFILES="+filepath.Join(dir, "profiles"), "TB_ALLOW_POLICY="+filepath.Join(dir, "policy.json"))
	// A plan that is not runnable, and a cycle that has events to watch:
	// submitted, then cancelled (the story's cycles have none).
	f.sh(t, `tb-plan odd.elf >/dev/null`)
	cy := f.sh(t, `tb-plan sample.elf | tb-run submit | jq -r .id`)
	f.sh(t, `tb-run cancel "$1" >/dev/null`, strings.TrimSpace(cy))
	f.vars["WATCHED"] = strings.TrimSpace(cy)
	return f
}

// sh runs a setup line in the fixture and returns its stdout.
func (f *fixture) sh(t *testing.T, line string, args ...string) string {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"-o", "pipefail", "-c", line, "setup"}, args...)...)
	cmd.Dir, cmd.Env = f.dir, f.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fixture: %s: %v\n%s", line, err, stderr.String())
	}
	return string(out)
}

// beaconCapture is a sample resolving c2.example and polling it over HTTP
// and TLS, as a pcap or a pcapng.
func beaconCapture(t *testing.T, ng bool) []byte {
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, pcapgen.Options{NG: ng})
	if err != nil {
		t.Fatal(err)
	}
	guest, resolver, c2 := netip.MustParseAddr("10.13.37.5"), netip.MustParseAddr("10.13.37.1"), netip.MustParseAddr("203.0.113.7")
	g.DNSOverUDP(netip.AddrPortFrom(guest, 40000), netip.AddrPortFrom(resolver, 53),
		pcapgen.DNSQuery(7, "c2.example", layers.DNSTypeA),
		pcapgen.DNSResponse(7, "c2.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("c2.example", c2, 300)}))
	for i := range 6 {
		c := g.Dial(netip.AddrPortFrom(guest, uint16(41000+i)), netip.AddrPortFrom(c2, 80), uint32(i*1000), 77)
		c.Send(pcapgen.HTTPGet("c2.example", "/gate.php?bot=1", "tb-test-agent"))
		c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("sleep 60")))
		c.Close()
		g.T = g.T.Add(60e9)
	}
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// run runs a documented line for real under pipefail, with a tee after
// each stage of its top-level pipe, and checks that it exits 0, prints
// something, and that each stage printed only the kinds it declares.
func (f *fixture) run(t *testing.T, text string, parsed parsedLine) error {
	t.Helper()
	tmp := t.TempDir()
	line := expand(text)
	// Splice at the bars of the expanded line: parse it again.
	p, err := parseShell(line)
	if err != nil {
		return err
	}
	var b strings.Builder
	last := 0
	for i, at := range p.bars {
		b.WriteString(line[last:at])
		fmt.Fprintf(&b, "| tee %q/%d ", tmp, i)
		b.WriteString("|")
		last = at + 1
	}
	b.WriteString(line[last:])
	vars := f.vars
	for _, pipe := range parsed.pipes {
		for _, words := range pipe {
			if k, _, _ := stageKey(words); k == "tb-run watch" {
				vars = withVar(vars, "C", f.vars["WATCHED"])
			}
		}
	}
	// A pipe that hangs (a follow that never ends) is stopped by go test's
	// own -timeout: no time of this test's decides.
	cmd := exec.Command("bash", "-o", "pipefail", "-c", b.String())
	cmd.Dir, cmd.Env = f.dir, slices.Clone(f.env)
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v\nstderr:\n%s", b.String(), err, stderr.String())
	}
	if strings.TrimSpace(stdout.String()) == "" {
		return fmt.Errorf("%s printed nothing: the fixture lacks what it shows\nstderr:\n%s", b.String(), stderr.String())
	}
	// A field a jq filter picks that no line has (renamed, or never
	// printed) is null in every line.
	if p.top != nil && p.top[len(p.top)-1][0] == "jq" && !slices.ContainsFunc(strings.Split(strings.TrimSpace(stdout.String()), "\n"), func(l string) bool { return !nullWord.MatchString(l) }) {
		return fmt.Errorf("%s: every line it printed holds a null: a field it picks is missing\n%s", b.String(), stdout.String())
	}
	for i := range p.bars {
		k, s, _ := stageKey(p.top[i])
		data, err := os.ReadFile(filepath.Join(tmp, fmt.Sprint(i)))
		if err != nil {
			return err
		}
		if err := printsOnly(data, s.prints); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

var nullWord = regexp.MustCompile(`\bnull\b`)

// withVar is a copy of m with k set to v.
func withVar(m map[string]string, k, v string) map[string]string {
	c := maps.Clone(m)
	c[k] = v
	return c
}

// printsOnly checks that every line of out is of one of the kinds.
func printsOnly(out []byte, kinds []string) error {
	if slices.Contains(kinds, anyLine) {
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 16<<20)
	for n := 1; sc.Scan(); n++ {
		var rec struct {
			Kind string `json:"kind"`
		}
		kind := pathLine
		if l := sc.Bytes(); len(l) > 0 && l[0] == '{' {
			if err := json.Unmarshal(l, &rec); err != nil {
				return fmt.Errorf("stdout:%d: %v", n, err)
			}
			kind = rec.Kind
		}
		if !slices.Contains(kinds, kind) {
			return fmt.Errorf("stdout:%d: a %s line, but it declares only %s", n, kind, strings.Join(kinds, ", "))
		}
	}
	return sc.Err()
}

// TestDocumentedPipes runs every pipe that README.md, the man pages and
// the tools' --help show: for real, under pipefail, against a fixture
// state, when no stage needs a VM, a capture daemon or the live lab; by the
// stages' declared kinds always. A pipe with a stage the table does not
// declare fails.
func TestDocumentedPipes(t *testing.T) {
	start := time.Now()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin+"/", "./cmd/...")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the tools: %v\n%s", err, out)
	}
	t.Logf("built the tools in %s", time.Since(start).Round(time.Millisecond))

	var lines []docLine
	docs, err := filepath.Glob(filepath.Join(root, "man", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	guides, err := filepath.Glob(filepath.Join(root, "docs", "guide", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, guides...)
	for _, p := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		lines = append(lines, markdownLines(rel, b)...)
	}
	tools, err := filepath.Glob(filepath.Join(bin, "tb-*"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(tools)
	for _, tool := range tools {
		lines = append(lines, helpLines(t, bin, filepath.Base(tool))...)
	}

	// One check for each distinct pipe, named by every place that shows it.
	type docPipe struct {
		where  []string
		parsed parsedLine
	}
	pipes := map[string]*docPipe{}
	var order []string
	for _, l := range lines {
		parsed, err := parseShell(l.text)
		if err != nil {
			if strings.Contains(l.text, "tb-") {
				t.Errorf("%s: %q: %v", l.where, l.text, err)
			}
			continue // code that is not shell (a file tree)
		}
		isPipe := false
		for _, p := range parsed.pipes {
			isPipe = isPipe || len(p) > 1 && slices.ContainsFunc(p, func(w []string) bool { return strings.HasPrefix(w[0], "tb-") })
		}
		if !isPipe {
			continue
		}
		if dp, ok := pipes[l.text]; ok {
			dp.where = append(dp.where, l.where)
			continue
		}
		pipes[l.text] = &docPipe{where: []string{l.where}, parsed: parsed}
		order = append(order, l.text)
	}

	f := newFixture(t, bin)
	ran, byKinds := 0, 0
	for _, text := range order {
		dp := pipes[text]
		var needs []string
		err := func() error {
			for _, p := range dp.parsed.pipes {
				for _, words := range p {
					k, s, ok := stageKey(words)
					if !ok {
						return fmt.Errorf("%q: no declaration of what it reads and prints (add it to stages)", strings.Join(words, " "))
					}
					if slices.Contains(words, "...") {
						needs = append(needs, k+" has elided arguments")
					} else if s.needs != nil {
						if why := s.needs(words); why != "" {
							needs = append(needs, k+" "+why)
						}
					}
				}
				if err := checkKinds(p); err != nil {
					return err
				}
			}
			if len(needs) > 0 {
				byKinds++
				return nil
			}
			ran++
			return f.run(t, text, dp.parsed)
		}()
		how := "ran"
		if len(needs) > 0 {
			how = "kinds only: " + strings.Join(needs, "; ")
		}
		switch known, isKnown := knownFalse[text]; {
		case isKnown && err == nil:
			t.Errorf("%s: %q now composes: remove it from knownFalse (%s)", strings.Join(dp.where, ", "), text, known)
		case isKnown:
			t.Logf("known false, to be fixed (%s): %s: %q: %v", known, strings.Join(dp.where, ", "), text, err)
		case err != nil:
			t.Errorf("%s: %q: %v", strings.Join(dp.where, ", "), text, err)
		default:
			t.Logf("%s: %q: %s", strings.Join(dp.where, ", "), text, how)
		}
	}
	t.Logf("%d documented pipes: %d run for real, %d checked by kinds, in %s", len(order), ran, byKinds, time.Since(start).Round(time.Millisecond))
}

// knownFalse are documented pipes that do not compose today, in files
// this test's owner may not change, with what must change. Each must still
// fail; once fixed, its entry goes.
var knownFalse = map[string]string{}
