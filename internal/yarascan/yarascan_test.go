package yarascan

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func compile(t *testing.T, dirs ...string) *Rules {
	t.Helper()
	r, err := Compile(context.Background(), dirs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// TestScanFindsRulesNamespacesTagsMetaAndOffsets: each rule file is a
// namespace named by its path; a match carries the rule's tags, meta and
// where its strings are.
func TestScanFindsRulesNamespacesTagsMetaAndOffsets(t *testing.T) {
	r := compile(t, "testdata/rules")
	if len(r.Files) != 2 {
		t.Fatalf("rule files %v", r.Files)
	}
	f := filepath.Join(t.TempDir(), "sample")
	// The sample's bytes try to look like yara's output.
	body := "xxTBHELLO\n0x0:$forged: x\nforged:Rule [] [] " + f + "\n#!/bin/sh\n# dropped by the Talkbox test beacon: does nothing\n"
	if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	ms, err := r.Scan(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(ms, func(a, b records.YaraMatch) int { return strings.Compare(a.Rule, b.Rule) })
	if len(ms) != 2 {
		t.Fatalf("matches %+v", ms)
	}
	b, d := ms[0], ms[1]
	if b.Namespace != "beacon" || b.Rule != "TalkboxBeacon" || !slices.Equal(b.Tags, []string{"talkbox", "demo"}) ||
		b.Meta["score"] != "50" || b.Meta["benign"] != "true" || b.Meta["description"] != "the Talkbox test beacon (benign)" ||
		!slices.Equal(b.Strings, []records.YaraString{{ID: "$hello", Offset: 2}}) {
		t.Errorf("beacon match %+v", b)
	}
	if d.Namespace != "family/dropper" || d.Rule != "TalkboxDrop" || d.Meta["description"] != `the file the beacon drops: "does nothing"` ||
		len(d.Strings) != 1 || d.Strings[0].Offset != int64(strings.Index(body, "dropped by")) {
		t.Errorf("drop match %+v", d)
	}
}

// TestBadRulesAreBadData: a rule that does not compile is exit 65, named
// with its file and line; no rules at all is no scan.
func TestBadRulesAreBadData(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bad.yar"), []byte("rule X {\n condition: $nope\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Compile(context.Background(), []string{dir})
	if fault.Code(err) != fault.ExitDataErr || !strings.Contains(err.Error(), "bad.yar(3)") {
		t.Fatalf("%v (exit %d)", err, fault.Code(err))
	}
	r, err := Compile(context.Background(), []string{t.TempDir()})
	if r != nil || err != nil {
		t.Fatalf("no rules: %v, %v", r, err)
	}
	if ms, err := r.Scan(context.Background(), "/nonexistent"); ms != nil || err != nil {
		t.Fatalf("nil rules scanned: %v %v", ms, err)
	}
}

func TestParseMeta(t *testing.T) {
	m, err := parseMeta(`s="a\",b=[x]",i =7,b=true`)
	if err != nil || m["s"] != `a",b=[x]` || m["i"] != "7" || m["b"] != "true" || len(m) != 3 {
		t.Fatalf("%q %v", m, err)
	}
}

// TestParseRefusesLinesYaraDidNotWrite: a header line that does not end
// with the scanned path, or has no tag or meta list, fails the scan rather
// than naming a rule; a string line's data is never read.
func TestParseRefusesLinesYaraDidNotWrite(t *testing.T) {
	const path = "/tmp/x/sample"
	ms, err := parse([]byte("ns:R [t] [k=\"v\"] "+path+"\n0x10:$a: forged:Rule [] [] "+path+"\n"), path)
	if err != nil || len(ms) != 1 || ms[0].Rule != "R" || len(ms[0].Strings) != 1 || ms[0].Strings[0].Offset != 16 {
		t.Fatalf("%+v %v", ms, err)
	}
	for _, out := range []string{"ns:R [t] []\n", "ns:R [t] [] /tmp/other\n", "ns:R " + path + "\n", "R [] [] " + path + "\n"} {
		if ms, err := parse([]byte(out), path); err == nil {
			t.Errorf("%q parsed as %+v", out, ms)
		}
	}
}
