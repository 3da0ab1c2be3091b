package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
)

const agentsHelp = `Define, change and remove agents: the unit 'neuron run AGENT' dispatches.
Definitions live in the orchestrator's AgentService (kept in the State
service), so they survive restarts and every orchestrator replica sees them.

  apply -f FILE             create the agents FILE defines, or update those that changed
                            (prints what changed; -f - reads stdin; --dry-run writes nothing)
  diff -f FILE              what apply would change, without writing
  list                      every agent (--label KEY=VALUE keeps those carrying the label)
  get NAME                  the definition as YAML, ready to edit and apply (--revision N: an earlier one)
  delete NAME               remove it; running workflows keep their revision (--expect-revision N)

A FILE holds one agent, a list of agents, {"agents": [...]}, or several YAML
documents separated by lines of "---"; YAML or JSON, with the fields of
layer0.agent.v1.Agent (protojson names). For example:

  name: reviewer
  definition:
    description: Reviews a change and lists its risks.
    instructions: You are a careful code reviewer. Answer with a list of risks.
    model: {name: gpt-4.1-mini}
    tools: {builtin: [read]}
    limits: {maxTurns: 8}
    route: {operator: {address: 127.0.0.1:7071}}`

// cmdAgents is `neuron agents`: apply, diff, list, get, delete.
func (c *cli) cmdAgents(ctx context.Context, args []string) error {
	const top = "Usage: neuron agents apply|diff|list|get|delete [flags]\n\n%s\n"
	if len(args) == 0 {
		fmt.Fprintf(c.stderr, top, agentsHelp)
		return &exitError{code: exitUsage}
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(c.stdout, top, agentsHelp)
		return nil
	}
	sub, args := args[0], args[1:]
	if sub == "ls" {
		sub = "list"
	}
	name := "agents " + sub
	synopses := map[string]string{
		"apply":  "neuron agents apply -f FILE [-f FILE...] [--dry-run] [flags]",
		"diff":   "neuron agents diff -f FILE [-f FILE...] [flags]",
		"list":   "neuron agents list [--label KEY=VALUE...] [flags]",
		"get":    "neuron agents get NAME [--revision N] [flags]",
		"delete": "neuron agents delete NAME [--expect-revision N] [flags]",
	}
	synopsis, ok := synopses[sub]
	if !ok {
		return usageErrorf("agents", "unknown subcommand %q: want apply, diff, list, get or delete", sub)
	}
	var (
		cn       conn
		files    listFlag
		labels   listFlag
		dryRun   bool
		revision uint64
		expect   = int64(-1)
	)
	fs := newFlagSet(name, synopsis, agentsHelp, c.stdout)
	cn.bind(fs, c, "orchestrator", "NEURON_ORCHESTRATOR_ADDR", defaultOrchestratorAddr, 30*time.Second)
	switch sub {
	case "apply", "diff":
		fs.Var(&files, "f", "a file of agent definitions (YAML or JSON); - is stdin; repeatable")
		if sub == "apply" {
			fs.BoolVar(&dryRun, "dry-run", false, "print what would change and write nothing")
		}
	case "list":
		fs.Var(&labels, "label", "only agents carrying this label, KEY=VALUE; repeatable (all must match)")
	case "get":
		fs.Uint64Var(&revision, "revision", 0, "an earlier revision (0: the current one)")
	case "delete":
		fs.Int64Var(&expect, "expect-revision", -1, "delete only if the agent's revision is this")
	}
	pos, err := parseArgs(fs, name, args)
	if err != nil {
		return err
	}
	want := map[string]int{"apply": 0, "diff": 0, "list": 0, "get": 1, "delete": 1}[sub]
	if len(pos) != want {
		return usageErrorf(name, "wrong number of arguments: %s", synopsis)
	}
	var agents []*agentv1.Agent
	if sub == "apply" || sub == "diff" {
		if len(files) == 0 {
			return usageErrorf(name, "name the definitions with -f FILE (- for stdin)")
		}
		for _, f := range files {
			as, err := c.readAgents(f)
			if err != nil {
				return err
			}
			agents = append(agents, as...)
		}
		if err := uniqueNames(agents); err != nil {
			return err
		}
	}
	selector := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return usageErrorf(name, "--label %q: want KEY=VALUE", l)
		}
		selector[k] = v
	}
	cc, err := cn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	cn.hints = map[codes.Code]string{
		codes.NotFound:           "`neuron agents list` shows the agents there are",
		codes.FailedPrecondition: "the agent changed since it was read: run the command again (`neuron agents diff -f FILE` shows what differs)",
	}
	client := agentv1.NewAgentServiceClient(cc)
	switch sub {
	case "apply":
		return c.applyAgents(ctx, client, &cn, agents, dryRun)
	case "diff":
		return c.applyAgents(ctx, client, &cn, agents, true)
	case "list":
		return c.listAgents(ctx, client, &cn, selector)
	case "get":
		r, err := client.GetAgent(ctx, &agentv1.GetAgentRequest{Name: pos[0], Revision: revision})
		if err != nil {
			return cn.wrap(err)
		}
		if cn.json {
			printJSONLine(c.stdout, r.GetAgent())
			return nil
		}
		return writeAgentYAML(c.stdout, r.GetAgent())
	default: // delete
		req := &agentv1.DeleteAgentRequest{Name: pos[0]}
		if expect >= 0 {
			req.ExpectedRevision = proto.Uint64(uint64(expect))
		}
		r, err := client.DeleteAgent(ctx, req)
		if err != nil {
			return cn.wrap(err)
		}
		if cn.json {
			printJSONLine(c.stdout, r)
			return nil
		}
		fmt.Fprintf(c.stdout, "agent %s deleted; workflows already running keep the revision they started with\n", pos[0])
		return nil
	}
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// maxDefinitionsFile bounds a definitions file (a definition is at most
// a few hundred KiB: instructions are capped at 64 KiB).
const maxDefinitionsFile = 16 << 20

// docSeparator splits a YAML stream into its documents.
var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// readAgents reads the agents a definitions file holds: one agent, a
// list, {"agents": [...]}, or several YAML documents. Fields are checked
// against layer0.agent.v1.Agent here, so a typo is reported with the
// file's name before anything is sent.
func (c *cli) readAgents(path string) ([]*agentv1.Agent, error) {
	var (
		b   []byte
		err error
	)
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(c.stdin, maxDefinitionsFile+1))
		path = "stdin"
	} else {
		var f *os.File
		if f, err = os.Open(path); err == nil {
			b, err = io.ReadAll(io.LimitReader(f, maxDefinitionsFile+1))
			f.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("agents: %w", err)
	}
	if len(b) > maxDefinitionsFile {
		return nil, fmt.Errorf("agents: %s is larger than %d MiB", path, maxDefinitionsFile>>20)
	}
	var agents []*agentv1.Agent
	for i, doc := range docSeparator.Split(string(b), -1) {
		where := path
		if i > 0 || docSeparator.MatchString(string(b)) {
			where = fmt.Sprintf("%s, document %d", path, i+1)
		}
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("agents: %s is not YAML or JSON: %w", where, err)
		}
		items, err := splitAgents(js)
		if err != nil {
			return nil, fmt.Errorf("agents: %s: %w", where, err)
		}
		for j, item := range items {
			a := &agentv1.Agent{}
			if err := protojson.Unmarshal(item, a); err != nil {
				return nil, fmt.Errorf("agents: %s, agent %d: %s (the fields are those of layer0.agent.v1.Agent: name, definition.{description, instructions, model, tools, limits, route, ...})", where, j+1, protojsonMessage(err))
			}
			if a.GetName() == "" {
				return nil, fmt.Errorf("agents: %s, agent %d has no name", where, j+1)
			}
			agents = append(agents, a)
		}
	}
	if len(agents) == 0 {
		return nil, fmt.Errorf("agents: %s defines no agent", path)
	}
	return agents, nil
}

// stripComments drops YAML comment lines, to tell an empty document.
func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// splitAgents returns the agents of one document: the document itself,
// the items of a list, or the items of {"agents": [...]}.
func splitAgents(js []byte) ([]json.RawMessage, error) {
	js = bytes.TrimSpace(js)
	if bytes.HasPrefix(js, []byte("[")) {
		var items []json.RawMessage
		if err := json.Unmarshal(js, &items); err != nil {
			return nil, err
		}
		return items, nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		return nil, errors.New("want an agent (an object with name and definition), a list of agents or {\"agents\": [...]}")
	}
	if list, ok := top["agents"]; ok && len(top) == 1 {
		var items []json.RawMessage
		if err := json.Unmarshal(list, &items); err != nil {
			return nil, errors.New(`"agents" must be a list of agents`)
		}
		return items, nil
	}
	return []json.RawMessage{js}, nil
}

// jsonPosition is protojson's "(line 1:16): ", which points into the
// JSON the YAML was converted to, not into the file.
var jsonPosition = regexp.MustCompile(`^\(line \d+:\d+\):\s*`)

// protojsonMessage is a protojson error without its package prefix and
// position.
func protojsonMessage(err error) string {
	s := strings.ReplaceAll(err.Error(), "\u00a0", " ")
	if i := strings.Index(s, "proto:"); i >= 0 {
		s = strings.TrimSpace(s[i+len("proto:"):])
	}
	return jsonPosition.ReplaceAllString(s, "")
}

// uniqueNames refuses two definitions of one agent in one apply.
func uniqueNames(agents []*agentv1.Agent) error {
	seen := map[string]bool{}
	for _, a := range agents {
		if seen[a.GetName()] {
			return fmt.Errorf("agents: %s is defined twice in the files given", a.GetName())
		}
		seen[a.GetName()] = true
	}
	return nil
}

// applyAgents creates the agents that do not exist and updates those
// whose definition differs, printing what changed; with dryRun it only
// prints. It stops at the first failure: the agents before it are
// applied, which the output says.
func (c *cli) applyAgents(ctx context.Context, client agentv1.AgentServiceClient, cn *conn, agents []*agentv1.Agent, dryRun bool) error {
	would := ""
	if dryRun {
		would = "would be "
	}
	for _, a := range agents {
		cur, err := client.GetAgent(ctx, &agentv1.GetAgentRequest{Name: a.GetName()})
		switch {
		case status.Code(err) == codes.NotFound:
			if !dryRun {
				r, err := client.CreateAgent(ctx, &agentv1.CreateAgentRequest{Agent: a})
				if err != nil {
					return cn.wrap(fmt.Errorf("creating %s: %w", a.GetName(), err))
				}
				a = r.GetAgent()
			}
			if cn.json {
				printJSONLine(c.stdout, map[string]any{"name": a.GetName(), "action": "create", "dryRun": dryRun, "revision": a.GetRevision()})
				continue
			}
			fmt.Fprintf(c.stdout, "agent %s %screated%s\n", a.GetName(), would, revisionNote(a.GetRevision()))
			for _, l := range definitionDiff(nil, a.GetDefinition()) {
				fmt.Fprintf(c.stdout, "  %s\n", l)
			}
		case err != nil:
			return cn.wrap(fmt.Errorf("reading %s: %w", a.GetName(), err))
		default:
			old := cur.GetAgent()
			changes := definitionDiff(old.GetDefinition(), a.GetDefinition())
			if len(changes) == 0 {
				if cn.json {
					printJSONLine(c.stdout, map[string]any{"name": a.GetName(), "action": "none", "revision": old.GetRevision()})
					continue
				}
				fmt.Fprintf(c.stdout, "agent %s unchanged (revision %d)\n", a.GetName(), old.GetRevision())
				continue
			}
			rev := uint64(0)
			if !dryRun {
				r, err := client.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{Agent: a, ExpectedRevision: old.GetRevision()})
				if err != nil {
					return cn.wrap(fmt.Errorf("updating %s: %w", a.GetName(), err))
				}
				rev = r.GetAgent().GetRevision()
			}
			if cn.json {
				printJSONLine(c.stdout, map[string]any{"name": a.GetName(), "action": "update", "dryRun": dryRun, "fromRevision": old.GetRevision(), "revision": rev, "changes": changes})
				continue
			}
			to := ""
			if rev != 0 {
				to = fmt.Sprintf(" -> %d", rev)
			}
			fmt.Fprintf(c.stdout, "agent %s %supdated (revision %d%s)\n", a.GetName(), would, old.GetRevision(), to)
			for _, l := range changes {
				fmt.Fprintf(c.stdout, "  %s\n", l)
			}
		}
	}
	return nil
}

// revisionNote is " (revision N)", or nothing for 0 (a dry run).
func revisionNote(rev uint64) string {
	if rev == 0 {
		return ""
	}
	return fmt.Sprintf(" (revision %d)", rev)
}

// definitionDiff lists the fields that differ between two definitions,
// one line per field path: "- path: old" and "+ path: new". Lists are
// compared whole. A nil old lists every field of new as added.
func definitionDiff(old, new *agentv1.AgentDefinition) []string {
	a, b := flatten(old), flatten(new)
	paths := make([]string, 0, len(a)+len(b))
	for p := range a {
		paths = append(paths, p)
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	var out []string
	for _, p := range paths {
		va, inA := a[p]
		vb, inB := b[p]
		switch {
		case inA && inB && va == vb:
		case inA && inB:
			out = append(out, "- "+p+": "+va, "+ "+p+": "+vb)
		case inA:
			out = append(out, "- "+p+": "+va)
		default:
			out = append(out, "+ "+p+": "+vb)
		}
	}
	return out
}

// flatten maps each leaf field of d (in protojson form) to its compact
// JSON value, by its dotted path.
func flatten(d *agentv1.AgentDefinition) map[string]string {
	out := map[string]string{}
	if d == nil {
		return out
	}
	b, err := protojson.Marshal(d)
	if err != nil {
		return out
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return out
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		if m, ok := v.(map[string]any); ok && len(m) > 0 {
			for k, x := range m {
				p := k
				if path != "" {
					p = path + "." + k
				}
				walk(p, x)
			}
			return
		}
		j, _ := json.Marshal(v)
		out[path] = oneLine(string(j))
	}
	walk("", v)
	return out
}

// listAgents prints every agent carrying the labels, page after page.
func (c *cli) listAgents(ctx context.Context, client agentv1.AgentServiceClient, cn *conn, selector map[string]string) error {
	var (
		agents []*agentv1.Agent
		token  string
	)
	for {
		r, err := client.ListAgents(ctx, &agentv1.ListAgentsRequest{PageSize: 1000, PageToken: token, LabelSelector: selector})
		if err != nil {
			return cn.wrap(err)
		}
		agents = append(agents, r.GetAgents()...)
		if token = r.GetNextPageToken(); token == "" {
			break
		}
	}
	if cn.json {
		for _, a := range agents {
			printJSONLine(c.stdout, a)
		}
		return nil
	}
	if len(agents) == 0 {
		fmt.Fprintln(c.stdout, "no agents; define one with `neuron agents apply -f FILE` (`neuron agents --help` shows the format)")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tREVISION\tMODEL\tROUTE\tUPDATED\tDESCRIPTION")
	for _, a := range agents {
		d := a.GetDefinition()
		model := d.GetModel().GetName()
		if model == "" {
			model = "(operator's default)"
		}
		updated := "-"
		if t := a.GetUpdateTime(); t != nil {
			updated = t.AsTime().UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", a.GetName(), a.GetRevision(), model, routeName(d.GetRoute()), updated, truncate(oneLine(d.GetDescription()), 60))
	}
	return tw.Flush()
}

// routeName says where an agent runs, in a few words.
func routeName(r *agentv1.Route) string {
	switch {
	case r.GetOperator() != nil:
		return "operator " + r.GetOperator().GetAddress()
	case r.GetEnvironment() != nil:
		return "environment " + r.GetEnvironment().GetAddress()
	}
	return "-"
}

// truncate cuts s to n runes, marking the cut.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// writeAgentYAML prints a as YAML in the form apply reads.
func writeAgentYAML(w io.Writer, a *agentv1.Agent) error {
	b, err := protojson.Marshal(a)
	if err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(b)
	if err != nil {
		return err
	}
	_, err = w.Write(y)
	return err
}
