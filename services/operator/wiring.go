package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/builtin"
	"github.com/secbear/neuron/services/operator/tool/effect"
	"github.com/secbear/neuron/services/operator/tool/mcp"
)

// toolRegistry registers the effect tools, the enabled built-in tools and
// the extra Go tools. oneShot says the operator runs inside an
// environment backend's sandbox.
func toolRegistry(cfg Config, oneShot bool, log *slog.Logger) (*tool.Registry, func(), error) {
	reg := tool.NewRegistry(tool.WithDefaultTimeout(cfg.ToolTimeout), tool.WithMaxOutputBytes(cfg.ToolMaxOutput))
	noop := func() {}
	if cfg.EffectTools {
		for _, t := range effect.All() {
			if err := reg.RegisterEffect(t); err != nil {
				return nil, noop, err
			}
		}
	}
	var names []string
	for _, n := range cfg.Tools {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	closeWS := noop
	if len(names) > 0 {
		var err error
		if closeWS, err = builtinTools(cfg, names, reg, oneShot, log); err != nil {
			return nil, noop, err
		}
	}
	for _, t := range cfg.ExtraTools {
		if err := reg.Register(t); err != nil {
			closeWS()
			return nil, noop, err
		}
	}
	return reg, closeWS, nil
}

// builtinTools opens the workspace and registers the built-in tools
// named. The function returned closes the workspace.
func builtinTools(cfg Config, names []string, reg *tool.Registry, oneShot bool, log *slog.Logger) (func(), error) {
	noop := func() {}
	dir, err := filepath.Abs(cfg.Workspace)
	if err != nil {
		return noop, fmt.Errorf("--workspace: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return noop, fmt.Errorf("--workspace: %w", err)
	}
	ws, err := builtin.OpenWorkspace(dir)
	if err != nil {
		return noop, fmt.Errorf("--workspace: %w", err)
	}
	var stateConn *grpc.ClientConn
	closeWS := func() {
		ws.Close()
		if stateConn != nil {
			_ = stateConn.Close()
		}
	}
	// memoryState is the State client of the memory tools, dialled once.
	memoryState := func() (statev1.StateServiceClient, error) {
		if stateConn == nil {
			if cfg.State.Target == "" {
				return nil, errors.New("--tools search_memory and read_memory need --state-addr (the State service they read)")
			}
			sc := cfg.State
			sc.WaitForReady = true
			c, err := grpcclient.Dial(sc)
			if err != nil {
				return nil, fmt.Errorf("--state-addr: %w", err)
			}
			stateConn = c
		}
		return statev1.NewStateServiceClient(stateConn), nil
	}
	for _, n := range names {
		var t tool.Tool
		switch n {
		case builtin.SearchMemoryName, builtin.ReadMemoryName:
			c, err := memoryState()
			if err != nil {
				closeWS()
				return noop, err
			}
			if n == builtin.SearchMemoryName {
				t = builtin.NewSearchMemory(c)
			} else {
				t = builtin.NewReadMemory(c)
			}
		case "read":
			t = builtin.NewRead(ws)
		case "write":
			t = builtin.NewWrite(ws)
		case "edit":
			t = builtin.NewEdit(ws)
		case "bash":
			if err := sandbox.Supported(); err != nil {
				if !cfg.SandboxUnconfined {
					closeWS()
					return noop, fmt.Errorf("the bash tool needs Landlock, which this kernel lacks (%v); drop bash from --tools, or for development only pass --dev --sandbox-unconfined", err)
				}
				log.Warn("SANDBOX UNCONFINED: bash runs without Landlock", "reason", err.Error())
			}
			// A private temp dir per call keeps mktemp files out of the
			// workspace; the default limits cap open files and file size.
			env := sandbox.DefaultEnv(dir)
			for _, name := range cfg.ToolEnv {
				if name = strings.TrimSpace(name); name == "" {
					continue
				}
				if v, ok := os.LookupEnv(name); ok {
					env = append(env, name+"="+v)
				}
			}
			var readOnly []string
			for _, p := range cfg.ToolReadOnly {
				if p = strings.TrimSpace(p); p != "" {
					readOnly = append(readOnly, p)
				}
			}
			// Standalone, every command gets its own namespaces: a
			// private root holding the workspace and the system's
			// programs only, no network, its own process tree (killed
			// whole when the command ends). In one-shot mode the
			// operator already runs inside an environment backend's
			// sandbox, whose seccomp filter refuses new namespaces:
			// commands then run under its namespaces, with their own
			// Landlock ruleset, filter and limits on top.
			ns := sandbox.Namespaces{User: true, Mount: true, PID: true, Net: true, IPC: true, UTS: true}
			if oneShot {
				ns = sandbox.Namespaces{}
			}
			t = builtin.NewBash(dir, sandbox.Policy{
				Workspace: dir, Env: env, ReadOnly: readOnly, PrivateTmp: true, Limits: sandbox.DefaultLimits(), AllowUnconfined: cfg.SandboxUnconfined,
				Namespaces: ns,
			})
		default:
			closeWS()
			return noop, fmt.Errorf("--tools: unknown tool %q; built-in tools are read, write, edit, bash, search_memory, read_memory", n)
		}
		if err := reg.Register(t); err != nil {
			closeWS()
			return noop, err
		}
	}
	log.Info("tools", "builtin", strings.Join(names, ","), "effect_tools", cfg.EffectTools, "workspace", dir)
	return closeWS, nil
}

// mcpTools connects to the MCP servers of cfg.MCPConfig and registers
// their tools beside the others (validated by the same registry).
func mcpTools(ctx context.Context, cfg Config, reg *tool.Registry, log *slog.Logger) (func(), error) {
	data, err := os.ReadFile(cfg.MCPConfig)
	if err != nil {
		return nil, fmt.Errorf("--mcp-config: %w", err)
	}
	servers, err := mcp.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("--mcp-config %s: %w", cfg.MCPConfig, err)
	}
	var clients []*mcp.Client
	closeAll := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	for _, s := range servers {
		c, err := mcp.Connect(ctx, s, log)
		if err != nil {
			closeAll()
			return nil, err
		}
		clients = append(clients, c)
		tools, err := c.Tools(ctx)
		if err != nil {
			closeAll()
			return nil, err
		}
		for _, t := range tools {
			if err := reg.Register(t); err != nil {
				closeAll()
				return nil, fmt.Errorf("MCP server %q: %w", s.Name, err)
			}
		}
		log.Info("MCP tools", "server", s.Name, "tools", len(tools))
	}
	return closeAll, nil
}
