//go:build unix

package clients_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/secbear/neuron/pkg/sandbox"
)

// walkthroughScript is the grpcurl walkthrough, relative to the
// repository's root.
const walkthroughScript = "clients/grpcurl-walkthrough.sh"

// walkthroughHeading opens README.md's section that shows the script's
// grpcurl commands.
const walkthroughHeading = "## grpcurl walkthrough"

// findGrpcurl returns the grpcurl scripts/client-deps.sh builds into the
// cache, else the one on PATH, else skips.
func findGrpcurl(t *testing.T) string {
	t.Helper()
	cached := filepath.Join(cacheDir(), "bin", "grpcurl")
	if _, err := os.Stat(cached); err == nil {
		return cached
	}
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	t.Skipf("grpcurl is neither in %s nor on PATH: run scripts/client-deps.sh", filepath.Dir(cached))
	return ""
}

// TestGrpcurlWalkthrough runs clients/grpcurl-walkthrough.sh against the
// four services and checks each step's output. Where the kernel cannot
// sandbox (no Landlock or no usable cgroup), the environment service
// forwards to the operator (--backend local) and the script skips its
// restrictive-spec call.
func TestGrpcurlWalkthrough(t *testing.T) {
	grpcurl := findGrpcurl(t)
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash is not on PATH")
	}
	mode := sandboxedEnvironment
	noSandbox := errors.Join(sandbox.Supported(), sandbox.CgroupSupported())
	if noSandbox != nil {
		mode = localEnvironment
		t.Logf("environment service with --backend local; the restrictive spec is skipped: %v", noSandbox)
	}
	sys := startSystem(t, mode)

	root := repoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash, filepath.Join(root, walkthroughScript))
	cmd.Dir = root
	skip := "0"
	if noSandbox != nil {
		skip = "1"
	}
	cmd.Env = append(os.Environ(), "GRPCURL="+grpcurl, "STATE="+sys.state, "OPERATOR="+sys.operator,
		"ORCHESTRATOR="+sys.orchestrator, "ENVIRONMENT="+sys.environment, "SKIP_SANDBOX_RUN="+skip)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", walkthroughScript, err, stdout.Bytes(), stderr.Bytes())
	}
	t.Logf("%s output:\n%s", walkthroughScript, stdout.Bytes())

	names, out := splitSteps(stdout.String())
	want := []string{
		"state: list", "operator: list", "orchestrator: list", "environment: list",
		"orchestrator: describe", "state: write", "state: read", "operator: execute", "orchestrator: dispatch",
		"environment: run",
	}
	if noSandbox != nil {
		want[len(want)-1] = "environment: run (skipped: SKIP_SANDBOX_RUN=1)"
	}
	if !slices.Equal(names, want) {
		t.Fatalf("steps %q, want %q", names, want)
	}

	// list: each service, health and reflection.
	for step, svc := range map[string][]string{
		"state: list":        {"layer0.state.v1.StateService"},
		"operator: list":     {"layer0.operator.v1.OperatorService"},
		"orchestrator: list": {"layer0.orchestrator.v1.OrchestratorService", "layer0.lifecycle.v1.LifecycleService"},
		"environment: list":  {"layer0.environment.v1.EnvironmentService"},
	} {
		listed := strings.Fields(out[step])
		for _, s := range append(svc, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection") {
			if !slices.Contains(listed, s) {
				t.Errorf("%s: %q not listed in %q", step, s, listed)
			}
		}
	}
	desc := out["orchestrator: describe"]
	for _, s := range []string{"layer0.orchestrator.v1.OrchestratorService is a service:", "rpc Dispatch ( .layer0.orchestrator.v1.DispatchRequest )"} {
		if !strings.Contains(desc, s) {
			t.Errorf("describe: no %q in\n%s", s, desc)
		}
	}

	// state: the value read back is the one written, at its revision.
	var written struct{ Revision string }
	decodeStep(t, out, "state: write", &written)
	var read struct {
		Value    map[string]any
		Revision string
	}
	decodeStep(t, out, "state: read", &read)
	if read.Value["text"] != "the quick brown fox" || written.Revision == "" || read.Revision != written.Revision {
		t.Errorf("read %v at revision %q after a write at revision %q; want {text: the quick brown fox} at the same revision", read.Value, read.Revision, written.Revision)
	}

	// operator and orchestrator: the scripted model's echo.
	var execute struct{ Output output }
	decodeStep(t, out, "operator: execute", &execute)
	if got := execute.Output.text(); got != echoPrefix+"hello" {
		t.Errorf("execute: text %q, want %q", got, echoPrefix+"hello")
	}
	var dispatch struct {
		WorkflowID string
		Output     output
		Effects    []struct{ Applied bool }
	}
	decodeStep(t, out, "orchestrator: dispatch", &dispatch)
	if got := dispatch.Output.text(); got != echoPrefix+"hello" || dispatch.WorkflowID == "" {
		t.Errorf("dispatch: workflow %q, text %q; want %q", dispatch.WorkflowID, got, echoPrefix+"hello")
	}
	if len(dispatch.Effects) == 0 || !dispatch.Effects[0].Applied {
		t.Errorf("dispatch effects %+v, want the conversation turn applied", dispatch.Effects)
	}

	// environment: the credential reached the command but comes back
	// redacted; /etc/shadow does not exist in the sandbox's root.
	if noSandbox != nil {
		return
	}
	if strings.Contains(out["environment: run"], ciToken) {
		t.Errorf("the injected credential came back:\n%s", out["environment: run"])
	}
	var run struct {
		Output  output
		Backend string
	}
	decodeStep(t, out, "environment: run", &run)
	text := run.Output.text()
	if run.Backend != "process" || !strings.Contains(text, "token=[REDACTED]") || !strings.Contains(text, "cat: /etc/shadow: No such file or directory") {
		t.Errorf("run: backend %q, text %q; want process, token=[REDACTED] and /etc/shadow absent from the sandbox's root", run.Backend, text)
	}
}

// output is the part of a protojson OperatorOutput the checks read.
type output struct {
	Message struct {
		Blocks []struct {
			Text *struct{ Text string }
		}
	}
}

func (o output) text() string {
	var b strings.Builder
	for _, blk := range o.Message.Blocks {
		if blk.Text != nil {
			b.WriteString(blk.Text.Text)
		}
	}
	return b.String()
}

// splitSteps splits the script's stdout at its "### <step>" lines.
func splitSteps(stdout string) (names []string, out map[string]string) {
	out = map[string]string{}
	cur := ""
	for line := range strings.Lines(stdout) {
		if name, ok := strings.CutPrefix(line, "### "); ok {
			cur = strings.TrimSpace(name)
			names = append(names, cur)
			continue
		}
		out[cur] += line
	}
	return names, out
}

func decodeStep(t *testing.T, out map[string]string, step string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out[step]), v); err != nil {
		t.Fatalf("%s: %v\n%s", step, err, out[step])
	}
}

// TestWalkthroughMatchesREADME: README.md's grpcurl walkthrough section
// shows exactly the script's grpcurl commands, with the addresses'
// defaults in place of $STATE etc. and grpcurl for $GRPCURL.
func TestWalkthroughMatchesREADME(t *testing.T) {
	root := repoRoot(t)
	script, err := os.ReadFile(filepath.Join(root, walkthroughScript))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	section, ok := markdownSection(string(readme), walkthroughHeading)
	if !ok {
		t.Skipf("README.md has no %q section", walkthroughHeading)
	}
	checkWalkthroughDoc(t, string(script), section)
}

// checkWalkthroughDoc checks that the grpcurl commands in the sh code
// blocks of a markdown section are those of the script.
func checkWalkthroughDoc(t *testing.T, script, section string) {
	t.Helper()
	fromScript := shellCommands(expandDefaults(t, script), "grpcurl")
	fromDoc := shellCommands(codeBlocks(section), "grpcurl")
	if len(fromScript) == 0 {
		t.Fatalf("no grpcurl command found in %s", walkthroughScript)
	}
	for _, c := range fromDoc {
		if !slices.Contains(fromScript, c) {
			t.Errorf("README command not in %s:\n%s", walkthroughScript, c)
		}
	}
	for _, c := range fromScript {
		if !slices.Contains(fromDoc, c) {
			t.Errorf("%s command not in README.md's %q section:\n%s", walkthroughScript, walkthroughHeading, c)
		}
	}
}

// defaultRE matches the script's `NAME=${NAME:-default}` lines.
var defaultRE = regexp.MustCompile(`(?m)^([A-Z_]+)=\$\{([A-Z_]+):-([^}]*)\}$`)

// expandDefaults replaces "$NAME" and $NAME in script by NAME's default,
// as set at the top of the script.
func expandDefaults(t *testing.T, script string) string {
	t.Helper()
	var pairs []string
	for _, m := range defaultRE.FindAllStringSubmatch(script, -1) {
		if m[1] != m[2] {
			t.Fatalf("%s: %q sets %s from %s", walkthroughScript, m[0], m[1], m[2])
		}
		pairs = append(pairs, `"$`+m[1]+`"`, m[3], "$"+m[1], m[3])
	}
	if len(pairs) == 0 {
		t.Fatalf("%s sets no NAME=${NAME:-default}", walkthroughScript)
	}
	return strings.NewReplacer(pairs...).Replace(script)
}

// markdownSection returns the text under the level-2 heading, up to the
// next level-2 heading.
func markdownSection(doc, heading string) (string, bool) {
	var b strings.Builder
	in := false
	for line := range strings.Lines(doc) {
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			in = strings.EqualFold(strings.TrimSpace(line), heading)
			continue
		}
		if in {
			b.WriteString(line)
		}
	}
	return b.String(), in
}

// codeBlocks returns the contents of the ```sh (or ```bash) fenced blocks
// of a markdown text.
func codeBlocks(md string) string {
	var b strings.Builder
	in := false
	for line := range strings.Lines(md) {
		trimmed := strings.TrimSpace(line)
		switch {
		case !in && (trimmed == "```sh" || trimmed == "```bash"):
			in = true
		case in && trimmed == "```":
			in = false
		case in:
			b.WriteString(line)
		}
	}
	return b.String()
}

// shellCommands returns the commands of a shell text that begin with
// word: each with its continuation lines (a trailing backslash, or a
// single-quoted string still open), without a trailing comment or
// trailing spaces.
func shellCommands(text, word string) []string {
	lines := strings.Split(text, "\n")
	var cmds []string
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], word+" ") {
			continue
		}
		var cmd []string
		quoted := false
		for ; i < len(lines); i++ {
			line, q, cont := scanShellLine(lines[i], quoted)
			cmd = append(cmd, line)
			quoted = q
			if !quoted && !cont {
				break
			}
		}
		cmds = append(cmds, strings.Join(cmd, "\n"))
	}
	return cmds
}

// scanShellLine follows single quotes through one line, starting inside
// one when quoted is set. It returns the line without a comment (a #
// outside quotes at the start or after a space) and trailing spaces,
// whether a single-quoted string is still open at its end, and whether
// it ends with a line-continuing backslash.
func scanShellLine(line string, quoted bool) (string, bool, bool) {
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case c == '\'':
			quoted = !quoted
		case c == '#' && !quoted && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			line = line[:i]
		}
	}
	line = strings.TrimRight(line, " \t")
	return line, quoted, !quoted && strings.HasSuffix(line, `\`)
}
