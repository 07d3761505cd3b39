package cli

import (
	"bytes"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

type exampleCLI struct {
	Globals
	Net struct {
		Up struct {
			Bridge string `name:"bridge"`
		} `cmd:"" help:"Bring it up."`
		Down struct{} `cmd:"" help:"Take it down."`
	} `cmd:"" help:"The network."`
	Get    GetCmd   `cmd:"" help:"Print records."`
	Daemon struct{} `cmd:"" hidden:""`
}

func exampleTool() Tool {
	return Tool{Name: "tb-x", Examples: map[string][]string{
		"":         {"tb-x net up --bridge br0"},
		"net":      {"tb-x net down"},
		"net up":   {"tb-x net up --bridge br0 --log-level debug # a global flag too"},
		"net down": {"tb-x net down && tb-x get lease_01JD... | jq .id"},
		"get":      {`tb-x get "$(tb-x net up | jq -r .id)"`},
	}}
}

func TestCheckExamples(t *testing.T) {
	if p := CheckExamples(exampleTool(), &exampleCLI{}); len(p) != 0 {
		t.Fatalf("complete examples: %q", p)
	}
	for _, c := range []struct {
		key, example string // "" example: none for key
		want         string
	}{
		{"net up", "", `"net up": no example`},
		{"net up", "tb-x net up --bridg br0", "unknown flag --bridg"},
		{"net up", "tb-x net down", `runs "net down", not "net up"`},
		{"net up", "tb-y net up", "does not start with tb-x"},
		{"net down", "tb-x net down && tb-x get --kind lease", "unknown flag --kind"},
		{"get", "tb-x get", `expected "<id> ..."`},
		{"net sideways", "tb-x net sideways", "command that does not exist"},
	} {
		tool := exampleTool()
		tool.Examples[c.key] = nil
		if c.example != "" {
			tool.Examples[c.key] = []string{c.example}
		}
		p := CheckExamples(tool, &exampleCLI{})
		if len(p) != 1 || !strings.Contains(p[0], c.want) {
			t.Errorf("%q for %q: got %q, want one problem with %q", c.example, c.key, p, c.want)
		}
	}
}

func TestHelpShowsExamples(t *testing.T) {
	for args, want := range map[string]string{
		"--help":              "\nExamples:\n  tb-x net up --bridge br0\n",
		"net --help":          "\nExamples:\n  tb-x net down\n",
		"net up --help":       "\nExamples:\n  tb-x net up --bridge br0 --log-level debug # a global flag too\n",
		"net down --bridge x": "", // not help
	} {
		var out bytes.Buffer
		p, err := exampleTool().parser(&exampleCLI{}, kong.Writers(&out, io.Discard), kong.Exit(func(int) {}))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = p.Parse(strings.Fields(args))
		if got := out.String(); !strings.HasSuffix(got, want) || want == "" && got != "" {
			t.Errorf("%s: help ends %q, want %q", args, got[max(0, len(got)-80):], want)
		}
	}
}

func TestShellCommands(t *testing.T) {
	for line, want := range map[string][][]string{
		`tb-x a --b 'c d' | jq -r '.e|f'`:  {{"tb-x", "a", "--b", "c d"}, {"jq", "-r", ".e|f"}},
		`tb-x a && tb-x b; tb-x c || true`: {{"tb-x", "a"}, {"tb-x", "b"}, {"tb-x", "c"}, {"true"}},
		`tb-x export > out.rules  # why`:   {{"tb-x", "export"}},
		`tb-x get "$(tb-x list | jq .id)"`: {{"tb-x", "get", "$(tb-x list | jq .id)"}},
		`tb-x --x=a#b`:                     {{"tb-x", "--x=a#b"}},
	} {
		if got := shellCommands(line); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %q, want %q", line, got, want)
		}
	}
}
