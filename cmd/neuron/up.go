package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/operator/provider/providers"
)

// upHelp is the help of `neuron up`.
func upHelp() string {
	return `Start the four services as child processes, each a real gRPC server on
its own port in dev mode (no TLS, no auth): state, operator, environment
and orchestrator, from the binaries beside neuron (make build puts them in
bin/). Each keeps its data under --data-dir/<service> and logs to
--data-dir/logs/<service>.log (truncated at each start); each address is
printed once it is SERVING. The demo agents (assistant and researcher)
are defined in the orchestrator's AgentService (kept in the State service)
when they are not defined yet, from --data-dir/demo-agents.yaml, written at
every start; neuron up keeps the definitions it manages (label
neuron.dev/managed-by=neuron-up) in step with this start's route and model
and never touches any other. Define your own agents with 'neuron agents
apply -f FILE'; they survive restarts.

Agents run in the environment service's process sandbox (Landlock,
namespaces, a cgroup: one fresh operator process per call) when this host
supports it, else on the operator service directly (--isolation). With
` + providers.EnableVars() + ` set,
the agents use that model: with a public API's key they still run in the
sandbox, and the environment's egress proxy adds the key to their model
calls (the key stays in --data-dir/environment/secrets, never in the
sandbox); a model server named by a base URL is reached from the operator
service directly. Without, the built-in scripted model answers from
per-agent scripts in the registry, and says so.

--demo then dispatches the assistant with a sample task and prints the
result, the cost, the effects applied and where the data lives, and keeps
serving; --demo-exit stops afterwards (its exit code is the demo's).

Ctrl-C or SIGTERM stops the services (SIGTERM, then SIGKILL after
--stop-timeout) and exits 0. A service that dies is reported with the end
of its log, the others are stopped, and neuron exits 1.`
}

// The services of `neuron up`, in start order.
var serviceNames = []string{"state", "operator", "environment", "orchestrator"}

// stopTiers is the stop order: the orchestrator first (its workflows
// pause), then the agent services, then state.
var stopTiers = [][]string{{"console", gatewayName}, {"orchestrator"}, {"operator", "environment"}, {"state"}}

// consoleName is the web console's binary (services/console), started
// after the four services when it is beside them (make build puts it
// there); without it neuron up runs without a console and says so.
const consoleName = "console"

// defaultConsoleAddr is where neuron up serves the console when the
// services are on their default addresses; on other addresses (a second
// neuron up, tests) "auto" takes any free loopback port, printed once
// the console is SERVING.
const defaultConsoleAddr = "127.0.0.1:7080"

// gatewayName is the gateway's binary (services/gateway), started after
// the four services when it is beside them: the agents over A2A, MCP and
// server-sent events. On the default addresses it serves gRPC on
// defaultGatewayAddr and HTTP on defaultGatewayHTTPAddr; on others, on
// free loopback ports.
const (
	gatewayName            = "gateway"
	defaultGatewayAddr     = "127.0.0.1:7076"
	defaultGatewayHTTPAddr = "127.0.0.1:7077"
)

// modelEnv are the variables that configure a real model, in the
// operator's order of preference (providers.ModelVars).
var modelEnv = providers.ModelVars()

// upFlags are the flags of `neuron up`.
type upFlags struct {
	binDir, dataDir string
	addrs           map[string]*string
	isolation       string
	model           string
	// mcpStdioAllow is the operator's --mcp-stdio-allow: the commands
	// agents' own stdio MCP servers may run.
	mcpStdioAllow string
	// consoleAddr is the web console's address; empty: no console.
	consoleAddr    string
	demo, demoExit bool
	startTimeout   time.Duration
	stopTimeout    time.Duration
	// otelEndpoint is every service's --otel-endpoint; empty: no export.
	otelEndpoint string
	// tracesURL is the console's --traces-url (the trace store's query
	// API its trace viewer reads); empty: no trace viewer.
	tracesURL string
	// jaeger starts a Jaeger beside the services (jaeger.go).
	jaeger bool
}

// up is one `neuron up`: the plan, then the running children.
type up struct {
	c        *cli
	out      io.Writer // c.stdout, safe for concurrent use
	f        upFlags
	dataAbs  string
	route    route
	routeWhy string
	// modelVar names the variable of the real model; empty: scripted.
	modelVar string
	// sidecar is the provider whose key the environment's egress proxy
	// adds to the sandboxed operators' model calls (sidecar credential
	// injection: the key never enters the sandbox); nil when agents do
	// not run sandboxed with a model key.
	sidecar  *providers.Descriptor
	children map[string]*child
	// gatewayHTTP is the gateway's HTTP address; empty: no gateway.
	gatewayHTTP string
	// demoAgents is the demo agents' registry YAML this start wrote.
	demoAgents []byte
}

// cmdUp is `neuron up`.
func (c *cli) cmdUp(ctx context.Context, args []string) error {
	f := upFlags{addrs: map[string]*string{}}
	fs := newFlagSet("up", "neuron up [flags]", upHelp(), c.stdout)
	self, _ := os.Executable()
	fs.StringVar(&f.binDir, "bin-dir", filepath.Dir(self), "directory of the service binaries (state, operator, environment, orchestrator)")
	fs.StringVar(&f.dataDir, "data-dir", ".data", "directory for the services' data, logs and the demo agents' definitions")
	for name, def := range map[string]string{
		"orchestrator": defaultOrchestratorAddr, "operator": defaultOperatorAddr,
		"state": defaultStateAddr, "environment": defaultEnvironmentAddr,
	} {
		f.addrs[name] = fs.String(name+"-addr", def, "address the "+name+" serves on")
	}
	fs.StringVar(&f.isolation, "isolation", "auto", "where agents run: auto (the process sandbox when the host supports it and the model is scripted), process (the sandbox, or fail), none (the operator service directly; needed for --session)")
	var nameModel []string // variables whose provider has no default model
	for _, d := range providers.All() {
		if d.DefaultModel == "" {
			nameModel = append(nameModel, d.EnableVar())
		}
	}
	fs.StringVar(&f.model, "model", "", "model for the operator when a real one is configured (required with "+strings.Join(nameModel, " or ")+" alone, e.g. llama3.2)")
	fs.StringVar(&f.mcpStdioAllow, "mcp-stdio-allow", "", "comma-separated commands agents' own stdio MCP servers may run (the operator's --mcp-stdio-allow; default: none)")
	fs.StringVar(&f.consoleAddr, "console-addr", "auto", "address the web console serves on, in dev mode, when the console binary is beside the services (auto: "+defaultConsoleAddr+" when the services are on their default addresses, else any free loopback port; none: no console)")
	fs.BoolVar(&f.demo, "demo", false, "run the sample workflow once everything is SERVING, then keep serving")
	fs.BoolVar(&f.demoExit, "demo-exit", false, "run the sample workflow, then stop everything; exit with the demo's code")
	fs.StringVar(&f.otelEndpoint, "otel-endpoint", "", "OTLP collector every service sends traces and metrics to: host:port (plaintext gRPC), http://host:port or https://host:port (each service's --otel-endpoint; empty: none)")
	fs.StringVar(&f.tracesURL, "traces-url", "", "the trace store's query API the console's trace viewer reads (Jaeger's, e.g. http://127.0.0.1:16686, beside --otel-endpoint pointing at the same Jaeger; empty: no trace viewer)")
	fs.BoolVar(&f.jaeger, "jaeger", false, "start Jaeger v2 (scripts/jaeger.sh builds it; NEURON_JAEGER names another) with traces in memory, send the services' traces to it and let the console's Trace page read them (sets --otel-endpoint and --traces-url)")
	fs.DurationVar(&f.startTimeout, "start-timeout", 60*time.Second, "how long the services may take to be SERVING")
	fs.DurationVar(&f.stopTimeout, "stop-timeout", 15*time.Second, "how long each service may take to stop after SIGTERM before it is killed")
	pos, err := parseArgs(fs, "up", args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("up", "unexpected arguments %q", pos)
	}
	if f.jaeger {
		stop, err := c.startJaeger(ctx, &f)
		if err != nil {
			return err
		}
		defer stop() // after the services stopped and flushed their spans
	}
	u, err := c.planUp(f)
	if err != nil {
		return err
	}
	return u.run(ctx)
}

// sidecarSecret is the name of the model key in the environment's
// --secrets-dir, as the demo agents' spec names it.
const sidecarSecret = "model-key"

// sidecarOf is the provider whose API key v is, when the environment's
// egress proxy can add it to the calls of sandboxed operators: a public
// API host (not a model server named by a base URL), and no base URL
// set that would send the calls elsewhere. Nil otherwise.
func sidecarOf(v string, getenv func(string) string) *providers.Descriptor {
	d, ok := providers.EnabledBy(v)
	if !ok || d.Host == "" || !slices.Contains(d.KeyEnv, v) || strings.TrimSpace(getenv(d.BaseURLEnv)) != "" {
		return nil
	}
	return &d
}

// planUp checks the flags and the binaries and decides the model and the
// route.
func (c *cli) planUp(f upFlags) (*up, error) {
	u := &up{c: c, out: &syncWriter{w: c.stdout}, f: f, children: map[string]*child{}}
	seen := map[string]string{}
	for _, name := range serviceNames {
		a := *f.addrs[name]
		if a == "" {
			return nil, usageErrorf("up", "--%s-addr is empty", name)
		}
		if other, dup := seen[a]; dup {
			return nil, usageErrorf("up", "--%s-addr and --%s-addr are both %s", other, name, a)
		}
		seen[a] = name
	}
	for _, name := range modelEnv {
		if strings.TrimSpace(c.getenv(name)) != "" {
			u.modelVar = name
			break
		}
	}
	if u.modelVar == "" && f.model != "" && f.model != "scripted" {
		return nil, usageErrorf("up", "--model %s needs a model provider: set %s", f.model, providers.EnableVars())
	}
	if d, ok := providers.EnabledBy(u.modelVar); ok && d.DefaultModel == "" && f.model == "" {
		return nil, usageErrorf("up", "%s is set: name the model its server serves with --model (e.g. --model llama3.2)", u.modelVar)
	}
	sandboxErr := sandbox.Supported()
	if sandboxErr == nil {
		sandboxErr = sandbox.CgroupSupported()
	}
	switch f.isolation {
	case "none":
		u.route, u.routeWhy = routeOperator, "on the operator service directly (--isolation none): no sandbox; sessions work"
	case "process":
		if u.modelVar != "" && sidecarOf(u.modelVar, c.getenv) == nil {
			return nil, usageErrorf("up", "--isolation process: %s names a model server (or a base URL is set), not a key the sandbox's egress proxy can add to a public API's calls; use --isolation auto or none", u.modelVar)
		}
		if sandboxErr != nil {
			return nil, &exitError{code: exitFailure, msg: "up: --isolation process: this host cannot sandbox the agents: " + sandboxErr.Error()}
		}
		u.route = routeEnvironment
	case "auto":
		switch {
		case u.modelVar != "" && sidecarOf(u.modelVar, c.getenv) == nil:
			u.route, u.routeWhy = routeOperator, fmt.Sprintf("on the operator service directly: %s with a model server or a base URL, which the sandbox (no network) cannot reach", u.modelVar)
		case sandboxErr != nil:
			u.route, u.routeWhy = routeOperator, "on the operator service directly: this host cannot sandbox them ("+oneLine(sandboxErr.Error())+")"
		default:
			u.route = routeEnvironment
		}
	default:
		return nil, usageErrorf("up", "--isolation %q: want auto, process or none", f.isolation)
	}
	if u.route == routeEnvironment {
		u.routeWhy = "through the environment service's process sandbox: each operator call is a fresh operator process under Landlock, namespaces and a cgroup, without network; session history is read through a read-only state bridge"
		if u.modelVar != "" {
			u.sidecar = sidecarOf(u.modelVar, c.getenv)
			u.routeWhy += fmt.Sprintf("; model calls go out through the egress proxy, which adds %s for %s (the key never enters the sandbox)", u.modelVar, u.sidecar.Host)
		}
	}
	for _, name := range serviceNames {
		p := filepath.Join(f.binDir, name)
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return nil, &exitError{code: exitFailure, msg: fmt.Sprintf("up: no %s binary in %s: run `make build`, or pass --bin-dir", name, f.binDir)}
		}
	}
	abs, err := filepath.Abs(f.dataDir)
	if err != nil {
		return nil, err
	}
	u.dataAbs = abs
	return u, nil
}

// checkPorts fails early, with what to do, when an address is taken
// (most often by a `neuron up` still running).
func (u *up) checkPorts() error {
	for _, name := range serviceNames {
		a := *u.f.addrs[name]
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return &exitError{code: exitFailure, msg: fmt.Sprintf("up: --%s-addr %s is not free (%s): is another `neuron up` running? Stop it, or pick other addresses with --%s-addr",
				name, a, oneLine(err.Error()), name)}
		}
		ln.Close()
	}
	if u.consoleBin() != "" && !strings.HasSuffix(u.f.consoleAddr, ":0") {
		ln, err := net.Listen("tcp", u.f.consoleAddr)
		if err != nil {
			return &exitError{code: exitFailure, msg: fmt.Sprintf("up: --console-addr %s is not free (%s): is another `neuron up` running? Stop it, or pick another with --console-addr (empty: no console)",
				u.f.consoleAddr, oneLine(err.Error()))}
		}
		ln.Close()
	}
	return nil
}

// consoleBin is the console binary to start, or "" when there is none
// beside the services or --console-addr is empty.
func (u *up) consoleBin() string {
	switch u.f.consoleAddr {
	case "", "none":
		return ""
	case "auto":
		u.f.consoleAddr = defaultConsoleAddr
		for name, def := range map[string]string{"orchestrator": defaultOrchestratorAddr, "operator": defaultOperatorAddr,
			"state": defaultStateAddr, "environment": defaultEnvironmentAddr} {
			if *u.f.addrs[name] != def {
				u.f.consoleAddr = "127.0.0.1:0"
			}
		}
	}
	p := filepath.Join(u.f.binDir, consoleName)
	if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return ""
	}
	return p
}

// shown is a path under the data dir as the user named it.
func (u *up) shown(elem ...string) string {
	return filepath.Join(append([]string{u.f.dataDir}, elem...)...)
}

// abs is a path under the data dir, absolute, for the children.
func (u *up) abs(elem ...string) string {
	return filepath.Join(append([]string{u.dataAbs}, elem...)...)
}

// prepare creates the data directories and writes the agent registry.
func (u *up) prepare() error {
	for _, d := range []string{"logs", "state", "orchestrator", "environment", filepath.Join("operator", "workspace")} {
		if err := os.MkdirAll(u.abs(d), 0o700); err != nil {
			return &exitError{code: exitFailure, msg: "up: --data-dir: " + err.Error()}
		}
	}
	if err := resumeKey(u.abs("operator", "resume.key")); err != nil {
		return &exitError{code: exitFailure, msg: "up: the operator's resume key: " + err.Error()}
	}
	reg, err := agentRegistry(registryConfig{
		route: u.route, operatorAddr: *u.f.addrs["operator"], environmentAddr: *u.f.addrs["environment"],
		scripted: u.modelVar == "", model: u.f.model,
		sidecar: u.sidecar,
	})
	if err != nil {
		return err
	}
	u.demoAgents = reg
	if u.sidecar != nil {
		// The key for the environment's egress proxy (--secrets-dir):
		// the sandboxed operators get only a placeholder.
		dir := u.abs("environment", "secrets")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return &exitError{code: exitFailure, msg: "up: the model key for the sandbox's egress proxy: " + err.Error()}
		}
		key := strings.TrimSpace(u.c.getenv(u.modelVar))
		if err := os.WriteFile(filepath.Join(dir, sidecarSecret), []byte(key+"\n"), 0o600); err != nil {
			return &exitError{code: exitFailure, msg: "up: the model key for the sandbox's egress proxy: " + err.Error()}
		}
	}
	if err := os.WriteFile(u.abs(demoAgentsFile), reg, 0o600); err != nil {
		return &exitError{code: exitFailure, msg: "up: writing the demo agents: " + err.Error()}
	}
	return nil
}

// resumeKey writes a random key signing the operator's resume tokens
// to path, unless it exists: a workflow waiting for a tool approval can
// then be resumed by the operator after a restart.
func resumeKey(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	var k [32]byte
	if _, err := rand.Read(k[:]); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(hex.EncodeToString(k[:])+"\n"), 0o600)
}

// plan builds the children's command lines.
func (u *up) plan() {
	addr := func(name string) string { return *u.f.addrs[name] }
	common := func(name string) []string {
		a := []string{"--dev", "--addr", addr(name), "--log-format", "json", "--shutdown-timeout", "5s"}
		if u.f.otelEndpoint != "" {
			a = append(a, "--otel-endpoint", u.f.otelEndpoint)
		}
		return a
	}
	args := map[string][]string{
		"state": append(common("state"), "--data-dir", u.abs("state")),
		"operator": append(common("operator"), "--state-addr", addr("state"), "--lifecycle-addr", addr("orchestrator"),
			"--workspace", u.abs("operator", "workspace"), "--resume-key-file", u.abs("operator", "resume.key")),
		"environment": append(common("environment"), "--data-dir", u.abs("environment"),
			"--operator-binary", filepath.Join(u.f.binDir, "operator"), "--state-addr", addr("state")),
		"orchestrator": append(common("orchestrator"), "--agents", u.abs(demoAgentsFile), "--state-addr", addr("state"),
			"--data-dir", u.abs("orchestrator")),
	}
	if u.sidecar != nil {
		args["environment"] = append(args["environment"], "--secrets-dir", u.abs("environment", "secrets"))
	}
	if u.f.model != "" {
		args["operator"] = append(args["operator"], "--model", u.f.model)
		// The model an OpenAI-compatible server serves is in no catalog:
		// agent definitions may name it all the same.
		args["orchestrator"] = append(args["orchestrator"], "--models", u.f.model)
	}
	if u.f.mcpStdioAllow != "" {
		args["operator"] = append(args["operator"], "--mcp-stdio-allow", u.f.mcpStdioAllow)
	}
	if sandbox.Supported() != nil {
		// The bash tool needs Landlock; the file tools do not.
		args["operator"] = append(args["operator"], "--tools", "read,write,edit")
	}
	for _, name := range serviceNames {
		u.children[name] = &child{
			name: name, addr: addr(name), bin: filepath.Join(u.f.binDir, name), args: args[name],
			logPath: u.abs("logs", name+".log"), logShown: u.shown("logs", name+".log"),
		}
	}
	if bin := u.consoleBin(); bin != "" {
		u.children[consoleName] = &child{
			name: consoleName, addr: u.f.consoleAddr, bin: bin,
			args: []string{"--dev", "--addr", u.f.consoleAddr, "--log-format", "json", "--shutdown-timeout", "5s",
				"--orchestrator-addr", addr("orchestrator"), "--state-addr", addr("state")},
			logPath: u.abs("logs", consoleName+".log"), logShown: u.shown("logs", consoleName+".log"),
		}
		if u.f.tracesURL != "" {
			u.children[consoleName].args = append(u.children[consoleName].args, "--traces-url", u.f.tracesURL)
		}
	}
	u.planGateway(addr)
}

// planGateway adds the gateway when its binary is beside the services.
func (u *up) planGateway(addr func(string) string) {
	bin := filepath.Join(u.f.binDir, gatewayName)
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return
	}
	grpcAddr, httpAddr := defaultGatewayAddr, defaultGatewayHTTPAddr
	if addr("orchestrator") != defaultOrchestratorAddr || addr("state") != defaultStateAddr {
		// Free ports, read back from its log (SERVING, HTTP SERVING).
		grpcAddr, httpAddr = "127.0.0.1:0", "127.0.0.1:0"
	}
	u.gatewayHTTP = httpAddr
	u.children[gatewayName] = &child{
		name: gatewayName, addr: grpcAddr, bin: bin,
		args: []string{"--dev", "--addr", grpcAddr, "--http-addr", httpAddr, "--log-format", "json", "--shutdown-timeout", "5s",
			"--orchestrator-addr", addr("orchestrator"), "--state-addr", addr("state")},
		logPath: u.abs("logs", gatewayName+".log"), logShown: u.shown("logs", gatewayName+".log"),
	}
}

// upEvent is news from a child: SERVING (addr set) or exited.
type upEvent struct {
	c      *child
	addr   string
	exited bool
}

// run starts the children, waits until they serve, runs the demo and
// serves until a signal or a death.
func (u *up) run(ctx context.Context) error {
	if err := u.checkPorts(); err != nil {
		return err
	}
	if err := u.prepare(); err != nil {
		return err
	}
	u.plan()
	fmt.Fprintf(u.out, "neuron up: starting %s from %s in dev mode (no TLS, no auth); data in %s\n",
		strings.Join(serviceNames, ", "), u.f.binDir, u.f.dataDir)
	sp := newSpawner()
	env := os.Environ()
	events := make(chan upEvent, 2*len(serviceNames)+2)
	// The add-ons (console, gateway) start once the services they call
	// serve: one of them listening on a free port (127.0.0.1:0) then
	// cannot take a port a service was given.
	var addons []string
	for _, name := range []string{consoleName, gatewayName} {
		if u.children[name] != nil {
			addons = append(addons, name)
		}
	}
	started := append(append([]string(nil), serviceNames...), addons...)
	launch := func(name string) error {
		ch := u.children[name]
		if err := ch.start(sp, env); err != nil {
			return err
		}
		go func() {
			select {
			case a := <-ch.serving:
				events <- upEvent{c: ch, addr: a}
			case <-ch.exited:
				events <- upEvent{c: ch, exited: true}
				return
			}
			<-ch.exited
			events <- upEvent{c: ch, exited: true}
		}()
		return nil
	}
	for _, name := range serviceNames {
		if err := launch(name); err != nil {
			fmt.Fprintf(u.c.stderr, "neuron up: %v\n", err)
			u.stopAll()
			return &exitError{code: exitFailure}
		}
	}

	pending := map[string]bool{}
	for _, n := range started {
		pending[n] = true
	}
	addonsStarted := false
	startTimer := time.NewTimer(u.f.startTimeout)
	defer startTimer.Stop()
	var demoDone chan int
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(u.out, "neuron up: stop requested")
			return u.stopAll()
		case ev := <-events:
			if ev.exited {
				when := ""
				if pending[ev.c.name] {
					when = " before it was SERVING"
				}
				fmt.Fprintf(u.c.stderr, "neuron up: %s exited%s (%s); the end of %s:\n%s", ev.c.name, when, ev.c.describeExit(), ev.c.logShown, ev.c.logTail())
				_ = u.stopAll()
				return &exitError{code: exitFailure, msg: fmt.Sprintf("%s exited; the other services were stopped (full log: %s)", ev.c.name, ev.c.logShown)}
			}
			delete(pending, ev.c.name)
			ev.c.addr = ev.addr // the address it serves on (the console's may be a free port)
			if a := ev.c.servedHTTP(); ev.c.name == gatewayName && a != "" {
				u.gatewayHTTP = a
			}
			fmt.Fprintf(u.out, "  %-13s SERVING on %-21s log %s\n", ev.c.name, ev.addr, ev.c.logShown)
			if len(pending) == len(addons) && !addonsStarted {
				addonsStarted = true
				for _, name := range addons {
					if err := launch(name); err != nil {
						fmt.Fprintf(u.c.stderr, "neuron up: %v\n", err)
						_ = u.stopAll()
						return &exitError{code: exitFailure}
					}
				}
			}
			if len(pending) == 0 {
				startTimer.Stop()
				u.syncDemoAgents(ctx)
				u.printReady()
				if u.f.demo || u.f.demoExit {
					demoDone = make(chan int, 1)
					go func() { demoDone <- u.runDemo(ctx) }()
				}
			}
		case <-startTimer.C:
			if len(pending) == 0 {
				continue
			}
			for _, name := range started {
				if ch := u.children[name]; pending[name] && ch.cmd != nil {
					fmt.Fprintf(u.c.stderr, "neuron up: %s is not SERVING after %s; the end of %s:\n%s", name, u.f.startTimeout, ch.logShown, ch.logTail())
				}
			}
			_ = u.stopAll()
			return &exitError{code: exitFailure, msg: fmt.Sprintf("not every service was SERVING within --start-timeout %s; see the logs in %s", u.f.startTimeout, u.shown("logs"))}
		case code := <-demoDone:
			demoDone = nil
			if u.f.demoExit {
				if err := u.stopAll(); err != nil {
					return err
				}
				if code != exitOK {
					return &exitError{code: code}
				}
				return nil
			}
			fmt.Fprintln(u.out, "\nneuron up: still serving; Ctrl-C stops everything.")
		}
	}
}

// printReady says what runs where, and how to use it.
func (u *up) printReady() {
	fmt.Fprintf(u.out, "agents    assistant, researcher and any you defined: neuron agents list · define yours: neuron agents apply -f FILE\n")
	fmt.Fprintf(u.out, "route     agents run %s\n", u.routeWhy)
	if u.modelVar == "" {
		fmt.Fprintf(u.out, "model     SCRIPTED: none of %s is set, so the built-in scripted model answers\n"+
			"          from the scripts in the demo agents' metadata (%s): the answers are scripted, NOT a language model's\n", providers.EnableVars(), u.shown(demoAgentsFile))
	} else {
		m := u.f.model
		if m == "" {
			m = "the operator's default"
		}
		fmt.Fprintf(u.out, "model     a real model from %s (%s)\n", u.modelVar, m)
	}
	if ch := u.children[consoleName]; ch != nil {
		fmt.Fprintf(u.out, "console   http://%s/  (workflows, transcripts, approvals, agents, state in a browser; no login in dev mode)\n", ch.addr)
	} else if u.f.consoleAddr != "" && u.f.consoleAddr != "none" {
		fmt.Fprintf(u.out, "console   not started: no %s binary in %s (make build puts it there)\n", consoleName, u.f.binDir)
	}
	if ch := u.children[gatewayName]; ch != nil {
		fmt.Fprintf(u.out, "gateway   A2A http://%s/a2a/<agent> (card: .well-known/agent-card.json under it; gRPC %s) · MCP http://%s/mcp · chat POST http://%s/v1/chat\n",
			u.gatewayHTTP, ch.addr, u.gatewayHTTP, u.gatewayHTTP)
	}
	fmt.Fprintf(u.out, "try       neuron run assistant \"your task\"  ·  neuron workflows list  ·  neuron events --after 0\n")
	if a, st := *u.f.addrs["orchestrator"], *u.f.addrs["state"]; a != defaultOrchestratorAddr || st != defaultStateAddr {
		fmt.Fprintf(u.out, "          (not the default addresses: export NEURON_ORCHESTRATOR_ADDR=%s NEURON_STATE_ADDR=%s, or pass --addr)\n", a, st)
	}
	if !u.f.demoExit {
		fmt.Fprintln(u.out, "          Ctrl-C stops everything.")
	}
}

// stopAll stops the children, tier by tier. It returns an error when one
// had to be killed or did not exit cleanly.
func (u *up) stopAll() error {
	fmt.Fprintf(u.out, "neuron up: stopping (SIGTERM; SIGKILL after %s)\n", u.f.stopTimeout)
	var (
		mu       sync.Mutex
		problems []string
	)
	for _, tier := range stopTiers {
		var wg sync.WaitGroup
		for _, name := range tier {
			ch := u.children[name]
			if ch == nil || ch.cmd == nil {
				continue
			}
			wasRunning := ch.running()
			wg.Add(1)
			go func() {
				defer wg.Done()
				killed, clean := ch.stop(u.f.stopTimeout)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case killed:
					problems = append(problems, fmt.Sprintf("%s did not stop within %s and was killed (log %s)", name, u.f.stopTimeout, ch.logShown))
				case wasRunning && !clean:
					problems = append(problems, fmt.Sprintf("%s stopped with %s (log %s)", name, ch.describeExit(), ch.logShown))
				}
			}()
		}
		wg.Wait()
	}
	if len(problems) > 0 {
		return &exitError{code: exitFailure, msg: "up: " + strings.Join(problems, "; ")}
	}
	fmt.Fprintln(u.out, "neuron up: all services stopped")
	return nil
}

// syncWriter serialises writes from the supervisor and the demo.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// Write implements io.Writer.
func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
