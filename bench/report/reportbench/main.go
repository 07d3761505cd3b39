// Command reportbench measures the lease report (issue 17): it builds a
// lease of -cycles hourly cycles in a state directory the way tb-run's
// post-processing would (a pcap per cycle parsed by tb-parse's code into
// observables and a flow log, tb-allow's classify and promote; see
// internal/leasereport/reporttest), or reuses the one -state holds, then
// times leasereport.Collect, WriteHTML and WriteJSON over -runs runs and
// prints the figures as a Markdown table.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/leasereport"
	"github.com/talkbox-sandbox/talkbox/internal/leasereport/reporttest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

func main() {
	cycles := flag.Int("cycles", 1000, "cycles of the lease")
	scanRate := flag.Float64("scan-rate", 1, "telnet scan probes a second, for five minutes of each cycle")
	dir := flag.String("state", "", "state directory (built when it holds no lease; default: a temporary one)")
	runs := flag.Int("runs", 5, "timed runs")
	out := flag.String("o", "", "also write the last run's HTML report here")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the timed runs here")
	flag.Parse()
	ctx := context.Background()
	if *dir == "" {
		tmp, err := os.MkdirTemp("", "reportbench")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(tmp)
		*dir = tmp
	}
	lease, err := prepare(ctx, *dir, *cycles, *scanRate)
	if err != nil {
		log.Fatal(err)
	}
	st, err := state.Open(ctx, *dir)
	if err != nil {
		log.Fatal(err)
	}
	var collect, html, jsonl, total []time.Duration
	var htmlBytes, jsonBytes countWriter
	var rep *leasereport.Report
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
	}
	for i := 0; i < *runs; i++ {
		runtime.GC()
		t0 := time.Now()
		rep, err = leasereport.Collect(ctx, st, leasereport.Target{Lease: lease})
		if err != nil {
			log.Fatal(err)
		}
		t1 := time.Now()
		htmlBytes = 0
		if err := leasereport.WriteHTML(&htmlBytes, rep); err != nil {
			log.Fatal(err)
		}
		t2 := time.Now()
		jsonBytes = 0
		if err := leasereport.WriteJSON(&jsonBytes, rep); err != nil {
			log.Fatal(err)
		}
		t3 := time.Now()
		collect, html, jsonl, total = append(collect, t1.Sub(t0)), append(html, t2.Sub(t1)), append(jsonl, t3.Sub(t2)), append(total, t2.Sub(t0))
	}
	pprof.StopCPUProfile()
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			log.Fatal(err)
		}
		if err := leasereport.WriteHTML(f, rep); err != nil {
			log.Fatal(err)
		}
		if err := f.Close(); err != nil {
			log.Fatal(err)
		}
	}
	var conns int64
	for _, h := range rep.Hours {
		conns += h.Connections
	}
	fmt.Printf("lease %s: %d cycles, %d revisions, %d allow-list events, %d hours, %d connections in the flow logs, %d C2s\n",
		lease, len(rep.Cycles), len(rep.Revisions), len(rep.Events), len(rep.Hours), conns, len(rep.C2s))
	fmt.Printf("HTML %d bytes, JSON lines %d bytes; GOMAXPROCS %d; %d runs (median, min, max)\n\n", int64(htmlBytes), int64(jsonBytes),
		runtime.GOMAXPROCS(0), *runs)
	fmt.Println("| step | median | min | max |")
	fmt.Println("|---|---|---|---|")
	for _, r := range []struct {
		name string
		d    []time.Duration
	}{{"Collect", collect}, {"WriteHTML", html}, {"Collect + WriteHTML", total}, {"WriteJSON", jsonl}} {
		slices.Sort(r.d)
		fmt.Printf("| %s | %s | %s | %s |\n", r.name, ms(r.d[len(r.d)/2]), ms(r.d[0]), ms(r.d[len(r.d)-1]))
	}
}

// prepare returns the lease the state holds, building it first when there
// is none.
func prepare(ctx context.Context, dir string, cycles int, scanRate float64) (string, error) {
	if ids, err := os.ReadDir(filepath.Join(dir, "records", records.KindLease)); err == nil && len(ids) > 0 {
		id := ids[0].Name()
		return id[:len(id)-len(filepath.Ext(id))], nil
	}
	st, clk, err := reporttest.Open(ctx, dir)
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	b, err := reporttest.Build(ctx, st, clk, reporttest.Hourly(cycles, scanRate))
	if err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "built %d cycles in %s\n", len(b.Cycles), time.Since(t0).Round(time.Second))
	return b.Lease, st.Close()
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/1e6) }
