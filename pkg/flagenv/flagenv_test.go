package flagenv

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestPrecedence(t *testing.T) {
	env := map[string]string{"NEURON_STATE_ADDR": "env:1", "NEURON_STATE_DATA_DIR": "/env", "NEURON_STATE_DEV": "true"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	addr := fs.String("addr", "def:0", "")
	dir := fs.String("data-dir", "/def", "")
	dev := fs.Bool("dev", false, "")
	other := fs.String("other", "keep", "")
	if err := Parse(fs, "NEURON_STATE", []string{"--addr", "flag:2"}, lookup); err != nil {
		t.Fatal(err)
	}
	if *addr != "flag:2" || *dir != "/env" || !*dev || *other != "keep" {
		t.Fatalf("addr=%s dir=%s dev=%v other=%s", *addr, *dir, *dev, *other)
	}
}

func TestBadEnvValueNamesVariable(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int("max-key-bytes", 1, "")
	err := Parse(fs, "P", nil, func(k string) (string, bool) { return "many", k == "P_MAX_KEY_BYTES" })
	if err == nil || err.Error()[:15] != "P_MAX_KEY_BYTES" {
		t.Fatalf("got %v", err)
	}
}

func TestSplitList(t *testing.T) {
	for in, want := range map[string]string{"": "", "a": "a", " a , ,b,": "a|b", ",,": ""} {
		if got := strings.Join(SplitList(in), "|"); got != want {
			t.Errorf("SplitList(%q) = %q, want %q", in, got, want)
		}
	}
}
