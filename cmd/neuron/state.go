package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/scope"
)

const stateHelp = `Read and write the State service: JSON values under keys in disjoint
scopes. Name the scope with exactly one of --session ID, --workflow ID,
--workflow ID --agent ID, --global or --custom NAME.

  get KEY                   print the value (--json: the value and its revision)
  put KEY JSON              write a value (--text: store the argument as a string; JSON "-": read stdin)
  delete KEY                remove a key
  list [PREFIX]             keys and revisions, in byte order
  search QUERY...           full-text search over the scope's values

The demo agent of 'neuron up' remembers its last run in the global scope:
  neuron state get --global assistant/last_run`

// scopeFlags name one Scope.
type scopeFlags struct {
	session, workflow, agent, custom string
	global                           bool
}

// bind registers the scope flags.
func (s *scopeFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&s.session, "session", "", "the scope of this session")
	fs.StringVar(&s.workflow, "workflow", "", "the scope of this workflow (with --agent: of one agent in it)")
	fs.StringVar(&s.agent, "agent", "", "the scope of this agent within --workflow")
	fs.BoolVar(&s.global, "global", false, "the global scope, shared by all workflows")
	fs.StringVar(&s.custom, "custom", "", "a custom scope, by name")
}

// scope returns the named scope, or a usage error unless exactly one is
// named.
func (s *scopeFlags) scope(cmd string) (*typesv1.Scope, error) {
	var (
		named []string
		sc    *typesv1.Scope
	)
	if s.session != "" {
		named, sc = append(named, "--session"), scope.Session(s.session)
	}
	switch {
	case s.agent != "" && s.workflow == "":
		return nil, usageErrorf(cmd, "--agent needs --workflow: an agent's scope is within one workflow")
	case s.agent != "":
		named, sc = append(named, "--workflow/--agent"), scope.Agent(s.workflow, s.agent)
	case s.workflow != "":
		named, sc = append(named, "--workflow"), scope.Workflow(s.workflow)
	}
	if s.global {
		named, sc = append(named, "--global"), scope.Global()
	}
	if s.custom != "" {
		named, sc = append(named, "--custom"), scope.Custom(s.custom)
	}
	switch len(named) {
	case 0:
		return nil, usageErrorf(cmd, "name a scope: --session ID, --workflow ID [--agent ID], --global or --custom NAME")
	case 1:
		return sc, nil
	}
	return nil, usageErrorf(cmd, "name one scope, not %s", strings.Join(named, " and "))
}

// cmdState is `neuron state`: one call to the State service.
func (c *cli) cmdState(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintf(c.stderr, "Usage: neuron state get|put|delete|list|search [flags]\n\n%s\n", stateHelp)
		return &exitError{code: exitUsage}
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(c.stdout, "Usage: neuron state get|put|delete|list|search [flags]\n\n%s\n", stateHelp)
		return nil
	}
	sub, args := args[0], args[1:]
	name := "state " + sub
	synopses := map[string]string{
		"get":    "neuron state get KEY SCOPE [flags]",
		"put":    "neuron state put KEY JSON SCOPE [--text] [--expect-revision N] [flags]",
		"delete": "neuron state delete KEY SCOPE [flags]",
		"list":   "neuron state list [PREFIX] SCOPE [flags]",
		"search": "neuron state search QUERY... SCOPE [--limit N] [flags]",
	}
	synopsis, ok := synopses[sub]
	if !ok {
		return usageErrorf("state", "unknown subcommand %q: want get, put, delete, list or search", sub)
	}
	var (
		cn     conn
		sf     scopeFlags
		text   bool
		expect = int64(-1)
		limit  int
	)
	fs := newFlagSet(name, synopsis, stateHelp, c.stdout)
	cn.bind(fs, c, "State service", "NEURON_STATE_ADDR", defaultStateAddr, 30*time.Second)
	sf.bind(fs)
	switch sub {
	case "put":
		fs.BoolVar(&text, "text", false, "store the value argument as a JSON string, not parsed as JSON")
		fs.Int64Var(&expect, "expect-revision", -1, "write only if the key's revision is this (0: only if it does not exist)")
	case "delete":
		fs.Int64Var(&expect, "expect-revision", -1, "delete only if the key's revision is this")
	case "search":
		fs.IntVar(&limit, "limit", 10, "at most this many results")
	}
	pos, err := parseArgs(fs, name, args)
	if err != nil {
		return err
	}
	counts := map[string][2]int{"get": {1, 1}, "put": {2, 2}, "delete": {1, 1}, "list": {0, 1}, "search": {1, 1 << 20}}[sub]
	if len(pos) < counts[0] || len(pos) > counts[1] {
		return usageErrorf(name, "wrong number of arguments: %s", synopsis)
	}
	sc, err := sf.scope(name)
	if err != nil {
		return err
	}
	var value *structpb.Value
	if sub == "put" {
		if value, err = c.parseValue(pos[1], text); err != nil {
			return err
		}
	}
	cc, err := cn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	cn.hints = map[codes.Code]string{codes.NotFound: "`neuron state list` shows the keys there are"}
	client := statev1.NewStateServiceClient(cc)
	var resp proto.Message
	switch sub {
	case "get":
		r, err := client.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: pos[0]})
		if err != nil {
			return cn.wrap(err)
		}
		if !cn.json {
			return printValue(c.stdout, r.GetValue())
		}
		resp = r
	case "put":
		req := &statev1.WriteRequest{Scope: sc, Key: pos[0], Value: value}
		if expect >= 0 {
			req.ExpectedRevision = proto.Uint64(uint64(expect))
		}
		r, err := client.Write(ctx, req)
		if err != nil {
			return cn.wrap(err)
		}
		if !cn.json {
			fmt.Fprintf(c.stdout, "%s written in scope %s: revision %d\n", pos[0], scope.String(sc), r.GetRevision())
			return nil
		}
		resp = r
	case "delete":
		req := &statev1.DeleteRequest{Scope: sc, Key: pos[0]}
		if expect >= 0 {
			req.ExpectedRevision = proto.Uint64(uint64(expect))
		}
		r, err := client.Delete(ctx, req)
		if err != nil {
			return cn.wrap(err)
		}
		if !cn.json {
			if r.GetExisted() {
				fmt.Fprintf(c.stdout, "%s deleted from scope %s\n", pos[0], scope.String(sc))
			} else {
				fmt.Fprintf(c.stdout, "%s did not exist in scope %s\n", pos[0], scope.String(sc))
			}
			return nil
		}
		resp = r
	case "list":
		return c.listKeys(ctx, client, &cn, sc, pos0(pos))
	case "search":
		r, err := client.Search(ctx, &statev1.SearchRequest{Scope: sc, Query: strings.Join(pos, " "), Limit: int32(min(max(limit, 0), 1000))})
		if err != nil {
			return cn.wrap(err)
		}
		if !cn.json {
			if len(r.GetResults()) == 0 {
				fmt.Fprintln(c.stdout, "no matches")
				return nil
			}
			tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tSCORE\tREVISION\tSNIPPET")
			for _, m := range r.GetResults() {
				fmt.Fprintf(tw, "%s\t%.3f\t%d\t%s\n", m.GetKey(), m.GetScore(), m.GetRevision(), oneLine(m.GetSnippet()))
			}
			return tw.Flush()
		}
		resp = r
	}
	printJSONLine(c.stdout, resp)
	return nil
}

// pos0 is the first positional argument, or "".
func pos0(pos []string) string {
	if len(pos) == 0 {
		return ""
	}
	return pos[0]
}

// parseValue reads a value argument: JSON, a string with --text, or
// stdin for "-".
func (c *cli) parseValue(arg string, text bool) (*structpb.Value, error) {
	if arg == "-" {
		b, err := io.ReadAll(io.LimitReader(c.stdin, 16<<20))
		if err != nil {
			return nil, fmt.Errorf("reading the value from stdin: %w", err)
		}
		arg = string(b)
	}
	if text {
		return structpb.NewStringValue(arg), nil
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal([]byte(arg), v); err != nil {
		return nil, usageErrorf("state put", "the value is not JSON; store text with --text, or quote it as JSON: '\"%s\"'", oneLine(arg))
	}
	return v, nil
}

// printValue prints a JSON value indented.
func printValue(w io.Writer, v *structpb.Value) error {
	b, err := protojson.Marshal(v)
	if err != nil {
		return err
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return err
	}
	pretty, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", pretty)
	return err
}

// listKeys prints every key with the prefix, page after page.
func (c *cli) listKeys(ctx context.Context, client statev1.StateServiceClient, cn *conn, sc *typesv1.Scope, prefix string) error {
	var (
		items []*statev1.ListItem
		token string
	)
	for {
		r, err := client.List(ctx, &statev1.ListRequest{Scope: sc, Prefix: prefix, PageSize: 1000, PageToken: token})
		if err != nil {
			return cn.wrap(err)
		}
		items = append(items, r.GetItems()...)
		if token = r.GetNextPageToken(); token == "" {
			break
		}
	}
	if cn.json {
		for _, it := range items {
			printJSONLine(c.stdout, it)
		}
		return nil
	}
	if len(items) == 0 {
		fmt.Fprintf(c.stdout, "no keys in scope %s\n", scope.String(sc))
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tREVISION")
	for _, it := range items {
		fmt.Fprintf(tw, "%s\t%d\n", it.GetKey(), it.GetRevision())
	}
	return tw.Flush()
}
