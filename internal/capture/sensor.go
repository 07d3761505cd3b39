package capture

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Meta is what a sensor's command template is rendered from.
type Meta struct {
	Capture string
	Lease   string
	Cycle   string
	Plan    string
	VMName  string
	Iface   string
	NetNS   string
	IP      string
	MAC     string
	Snaplen int
	Filter  string
	// Dir is the sensor's own output directory.
	Dir string
}

// Sensor is external instrumentation that runs beside the capture.
type Sensor interface {
	Name() string
	// Prepare renders the command and creates the output directory.
	Prepare(ctx context.Context, m Meta) error
	// Start launches the sensor; the channel receives its exit.
	Start(ctx context.Context) (pid int, exited <-chan error, err error)
	// Stop asks it to finish and waits (bounded) for it.
	Stop(ctx context.Context) error
	// Collect lists the files it produced.
	Collect(ctx context.Context) ([]string, error)
}

// CommandSensor runs a command rendered from a text/template in the
// capture's network namespace.
type CommandSensor struct {
	SensorName string `json:"-"`
	// Template is the command line, split into arguments as a shell would
	// split it (single and double quotes, backslash; no expansion, no
	// shell); fields of Meta are available ({{.Iface}}, {{.Dir}},
	// {{.Snaplen}}, {{.Filter}}, …) and {{quote .Filter}} quotes a value
	// as one argument.
	Template string `json:"template"`
	// Program must be on PATH for the sensor to be available.
	Program string `json:"program"`
	// Output is the glob (relative to Dir) of the files to collect.
	Output string `json:"output"`

	meta Meta
	argv []string
	cmd  *exec.Cmd
	done chan error
}

// Name implements Sensor.
func (s *CommandSensor) Name() string { return s.SensorName }

// SensorsDir is where an analyst's own sensors are defined, one
// NAME.json (CommandSensor's fields) each, under the state directory.
func SensorsDir(st *state.Store) string { return st.Path("tb-capture", "sensors") }

// LoadSensor returns a sensor by name: tcpdump or dumpcap (Debian
// packages), or the analyst's own from dir/NAME.json (Zeek and Suricata,
// which Debian 12 does not package, go there: see examples/sensors).
func LoadSensor(dir, name string) (*CommandSensor, error) {
	switch name {
	case "tcpdump":
		return &CommandSensor{SensorName: name, Program: "tcpdump", Output: "*.pcap*",
			Template: `tcpdump -n -U --immediate-mode -B 32768 -i {{.Iface}} -s {{.Snaplen}} -w {{.Dir}}/tcpdump.pcap{{if .Filter}} {{quote .Filter}}{{end}}`}, nil
	case "dumpcap":
		return &CommandSensor{SensorName: name, Program: "dumpcap", Output: "*.pcapng",
			Template: `dumpcap -q -n -i {{.Iface}} -s {{.Snaplen}} -w {{.Dir}}/dumpcap.pcapng{{if .Filter}} -f {{quote .Filter}}{{end}}`}, nil
	}
	if !validSensorName(name) {
		return nil, fmt.Errorf("unknown sensor %q (tcpdump, dumpcap, or NAME.json in %s)", name, dir)
	}
	path := filepath.Join(dir, name+".json")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("unknown sensor %q (tcpdump, dumpcap, or NAME.json in %s): %w", name, dir, err)
	}
	s := &CommandSensor{SensorName: name}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(s); err != nil {
		return nil, fmt.Errorf("sensor %s: %w", path, err)
	}
	if s.Program == "" || s.Template == "" || s.Output == "" {
		return nil, fmt.Errorf("sensor %s: program, template and output are required", path)
	}
	if _, err := template.New(name).Funcs(templateFuncs).Parse(s.Template); err != nil {
		return nil, fmt.Errorf("sensor %s: template: %w", path, err)
	}
	return s, nil
}

func validSensorName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

var templateFuncs = template.FuncMap{"quote": shellQuote}

// shellQuote quotes s as one argument of splitArgs (and of a shell).
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// splitArgs splits a command line into arguments as a shell does (single
// and double quotes, backslash escapes), without expanding anything.
func splitArgs(line string) ([]string, error) {
	var args []string
	var cur strings.Builder
	in, quote, escaped := false, rune(0), false
	for _, c := range line {
		switch {
		case escaped:
			cur.WriteRune(c)
			escaped, in = false, true
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				cur.WriteRune(c)
			}
		case quote == '"':
			switch c {
			case '"':
				quote = 0
			case '\\':
				escaped = true
			default:
				cur.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == '\\':
			escaped = true
		case c == ' ' || c == '\t' || c == '\n':
			if in {
				args = append(args, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(c)
			in = true
		}
	}
	if quote != 0 || escaped {
		return nil, fmt.Errorf("unterminated quote or escape in %q", line)
	}
	if in {
		args = append(args, cur.String())
	}
	return args, nil
}

// Prepare implements Sensor.
func (s *CommandSensor) Prepare(ctx context.Context, m Meta) error {
	if _, err := exec.LookPath(s.Program); err != nil {
		return fmt.Errorf("sensor %s: %s is not installed", s.SensorName, s.Program)
	}
	t, err := template.New(s.SensorName).Option("missingkey=error").Funcs(templateFuncs).Parse(s.Template)
	if err != nil {
		return fmt.Errorf("sensor %s: template: %w", s.SensorName, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, m); err != nil {
		return fmt.Errorf("sensor %s: template: %w", s.SensorName, err)
	}
	if s.argv, err = splitArgs(b.String()); err != nil {
		return fmt.Errorf("sensor %s: %w", s.SensorName, err)
	}
	if len(s.argv) == 0 {
		return fmt.Errorf("sensor %s: empty command", s.SensorName)
	}
	s.meta = m
	return os.MkdirAll(m.Dir, 0o750)
}

// Start implements Sensor.
func (s *CommandSensor) Start(ctx context.Context) (int, <-chan error, error) {
	logf, err := os.OpenFile(filepath.Join(s.meta.Dir, s.SensorName+".stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return 0, nil, err
	}
	defer logf.Close()
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Dir = s.meta.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := netns.Do(netns.Path(s.meta.NetNS), cmd.Start); err != nil {
		return 0, nil, fmt.Errorf("sensor %s: %w", s.SensorName, err)
	}
	s.cmd = cmd
	s.done = make(chan error, 1)
	out := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		s.done <- err
		out <- err
	}()
	return cmd.Process.Pid, out, nil
}

// Stop implements Sensor: SIGTERM, then SIGKILL after 10 seconds.
func (s *CommandSensor) Stop(ctx context.Context) error {
	if s.cmd == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
	return nil
}

// Collect implements Sensor.
func (s *CommandSensor) Collect(ctx context.Context) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(s.meta.Dir, s.Output))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		if st, err := os.Stat(f); err == nil && st.Mode().IsRegular() && !strings.HasSuffix(f, ".stderr") {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out, nil
}

// SensorRestarts is how often a sensor that dies is restarted before it
// is marked failed.
const SensorRestarts = 3

func (d *Daemon) meta(s Sensor) Meta {
	return Meta{Capture: d.ID, Lease: d.rec.Lease, Cycle: d.rec.Cycle, Plan: d.rec.Plan, Iface: d.rec.Iface,
		NetNS: d.rec.NetNS, IP: d.rec.IP, Snaplen: d.rec.Snaplen, Filter: d.sensorFilter(),
		Dir: filepath.Join(d.rec.Spool, "sensors", s.Name())}
}

// sensorFilter is the filter the sensors are given: the capture's, and on
// a bound tap what the capture itself keeps out, kept out of theirs too
// (the frames sent to the guest, and those from it that the bridge lets
// through): a sample's forged frames must not reach an analysis by way of
// a sensor's file either.
func (d *Daemon) sensorFilter() string {
	if d.bound == nil {
		return d.rec.Filter
	}
	// The guest's frames first: libpcap filters the first frames after the
	// filter is set again in userland, where it cannot read the direction
	// (outbound) and rejects the frame; the guest's pass before it is read.
	keep := "(" + d.bound.PcapFilter(d.rec.Bound.DHCP) + ") or outbound"
	if d.rec.Filter == "" {
		return keep
	}
	return "(" + keep + ") and (" + d.rec.Filter + ")"
}

func (d *Daemon) setSensor(ctx context.Context, st records.SensorStatus) {
	d.update(ctx, func(c *records.Capture) {
		for i := range c.Sensors {
			if c.Sensors[i].Name == st.Name {
				c.Sensors[i] = st
				return
			}
		}
		c.Sensors = append(c.Sensors, st)
	})
}

// startSensors starts each sensor with a supervisor that restarts it when
// it dies, up to SensorRestarts times, recording each death.
func (d *Daemon) startSensors(ctx context.Context) {
	for _, s := range d.Sensors {
		st := records.SensorStatus{Name: s.Name(), State: StateRunning}
		if err := s.Prepare(ctx, d.meta(s)); err != nil {
			st.State, st.Error = StateFailed, err.Error()
			d.setSensor(ctx, st)
			continue
		}
		go d.supervise(ctx, s, st)
	}
}

func (d *Daemon) supervise(ctx context.Context, s Sensor, st records.SensorStatus) {
	for {
		pid, exited, err := s.Start(ctx)
		if err != nil {
			st.State, st.Error = StateFailed, err.Error()
			d.setSensor(ctx, st)
			return
		}
		st.PID, st.State = pid, StateRunning
		d.setSensor(ctx, st)
		select {
		case <-ctx.Done():
			return
		case err := <-exited:
			if ctx.Err() != nil {
				return
			}
			st.Error = fmt.Sprintf("exited: %v", err)
			if st.Restarts >= SensorRestarts {
				st.State, st.PID = StateFailed, 0
				d.setSensor(ctx, st)
				d.Log.Error("sensor failed", "sensor", s.Name(), "err", err)
				return
			}
			st.Restarts++
			d.Log.Warn("sensor died; restarting", "sensor", s.Name(), "err", err, "restarts", st.Restarts)
		}
	}
}

func (d *Daemon) stopSensors(ctx context.Context) {
	for _, s := range d.Sensors {
		s.Stop(ctx)
		d.update(ctx, func(c *records.Capture) {
			for i := range c.Sensors {
				if c.Sensors[i].Name == s.Name() && c.Sensors[i].State == StateRunning {
					c.Sensors[i].State, c.Sensors[i].PID = StateStopped, 0
				}
			}
		})
	}
}

// collectSensors registers the sensors' files as artifacts.
func (d *Daemon) collectSensors(ctx context.Context) []string {
	var ids []string
	for _, s := range d.Sensors {
		files, err := s.Collect(ctx)
		if err != nil {
			continue
		}
		for _, p := range files {
			if err := d.roomFor(p); err != nil {
				// Copying it could fill the disk: it stays in the spool.
				d.Log.Error("not registering sensor output", "file", p, "err", err)
				continue
			}
			fh, err := os.Open(p)
			if err != nil {
				continue
			}
			blob, unlock, err := storeBlob(ctx, d.St, fh)
			fh.Close()
			if err != nil {
				d.Log.Error("registering sensor output", "file", p, "err", err)
				continue
			}
			a := &records.Artifact{Cycle: d.rec.Cycle, Lease: d.rec.Lease, Capture: d.ID, Type: "sensor-output",
				Sensor: s.Name(), URI: blob.URI(), SHA256: blob.SHA256, Size: blob.Size, ParserStatus: "pending",
				ContentType: contentType(p), Iface: d.rec.Iface, Metadata: map[string]any{"file": filepath.Base(p)}}
			records.Init(a, records.KindArtifact, d.St.Now())
			err = d.St.Create(ctx, a)
			unlock()
			if err == nil {
				ids = append(ids, a.ID)
				d.update(ctx, func(c *records.Capture) { c.Artifacts = append(c.Artifacts, a.ID) })
			}
		}
	}
	return ids
}

func contentType(p string) string {
	switch filepath.Ext(p) {
	case ".pcap":
		return "application/vnd.tcpdump.pcap"
	case ".log", ".json":
		return "text/plain"
	}
	return "application/octet-stream"
}
