package flagenv

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// EnvName is the variable that backs flag name under prefix.
func EnvName(prefix, name string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Parse parses args into fs, then fills every flag not given on the
// command line from its environment variable. lookup is os.LookupEnv in
// production; tests pass their own.
func Parse(fs *flag.FlagSet, prefix string, args []string, lookup func(string) (string, bool)) error {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := EnvName(prefix, f.Name)
		if v, ok := lookup(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return err
}

// Usage returns a usage function that lists each flag with its variable.
func Usage(fs *flag.FlagSet, prefix, summary string) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "%s\n\nFlags (each also read from its environment variable):\n", summary)
		fs.VisitAll(func(f *flag.Flag) {
			fmt.Fprintf(w, "  --%s  [%s]\n    \t%s", f.Name, EnvName(prefix, f.Name), f.Usage)
			if f.DefValue != "" {
				fmt.Fprintf(w, " (default %q)", f.DefValue)
			}
			fmt.Fprintln(w)
		})
	}
}

// SplitList splits a comma-separated flag value (or its environment
// variable's), trimming items and dropping empty ones.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
