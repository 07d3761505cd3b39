package capture

import (
	"bytes"
	"context"
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
	SensorName string
	// Template is the command line; fields of Meta are available
	// ({{.Iface}}, {{.Dir}}, …) and {{quote .Filter}} shell-quotes.
	Template string
	// Program must be on PATH for the sensor to be available.
	Program string
	// Output is the glob (relative to Dir) of the files to collect.
	Output string

	meta Meta
	argv []string
	cmd  *exec.Cmd
	done chan error
}

// Name implements Sensor.
func (s *CommandSensor) Name() string { return s.SensorName }

// Builtin sensors, by name.
func Builtin(name string) (*CommandSensor, error) {
	switch name {
	case "tcpdump":
		return &CommandSensor{SensorName: "tcpdump", Program: "tcpdump", Output: "*.pcap*",
			Template: `tcpdump -n -U -i {{.Iface}} -s {{.Snaplen}} -w {{.Dir}}/tcpdump.pcap{{if .Filter}} {{.Filter}}{{end}}`}, nil
	case "zeek":
		return &CommandSensor{SensorName: "zeek", Program: "zeek", Output: "*.log",
			Template: `zeek -C -i {{.Iface}}`}, nil
	case "suricata":
		return &CommandSensor{SensorName: "suricata", Program: "suricata", Output: "*",
			Template: `suricata -i {{.Iface}} -l {{.Dir}}`}, nil
	}
	return nil, fmt.Errorf("unknown sensor %q (tcpdump, zeek, suricata)", name)
}

// Prepare implements Sensor.
func (s *CommandSensor) Prepare(ctx context.Context, m Meta) error {
	if _, err := exec.LookPath(s.Program); err != nil {
		return fmt.Errorf("sensor %s: %s is not installed", s.SensorName, s.Program)
	}
	t, err := template.New(s.SensorName).Option("missingkey=error").Parse(s.Template)
	if err != nil {
		return fmt.Errorf("sensor %s: template: %w", s.SensorName, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, m); err != nil {
		return fmt.Errorf("sensor %s: template: %w", s.SensorName, err)
	}
	s.argv = strings.Fields(b.String())
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
