package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// newFlagSet returns a flag set for one command whose --help prints the
// synopsis, a description and the flags to w.
func newFlagSet(name, synopsis, description string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("neuron "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fs.SetOutput(w)
		fmt.Fprintf(w, "Usage: %s\n\n%s\n", synopsis, strings.TrimSpace(description))
		var n int
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintf(w, "\nFlags:\n")
			fs.PrintDefaults()
		}
		fmt.Fprintf(w, "\nExit codes: 0 ok, 1 error, 2 usage, 3 workflow not completed, 4 waiting for approval, 10+N gRPC status code N (see 'neuron help').\n")
	}
	return fs
}

// parseArgs parses flags anywhere among the arguments (`neuron run
// assistant "task" --json` as well as `neuron run --json assistant
// "task"`) and returns the positional ones. Everything after "--" is
// positional.
//
// Help (-h, --help) prints the flag set's Usage and returns flag.ErrHelp;
// a bad flag returns a usage error (printed once, by the caller).
func parseArgs(fs *flag.FlagSet, cmd string, args []string) ([]string, error) {
	help := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = help }()
	var pos []string
	for {
		fs.SetOutput(io.Discard)
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				help()
				return nil, err
			}
			return nil, usageErrorf(cmd, "%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// isTerminal reports whether f is a terminal (a character device).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// envOr returns the environment variable name's value, or def when unset.
func (c *cli) envOr(name, def string) string {
	if v := strings.TrimSpace(c.getenv(name)); v != "" {
		return v
	}
	return def
}
