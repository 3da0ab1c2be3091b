package docker

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/secbear/neuron/services/environment"
)

// The environment service's Run builds this backend for "docker"
// (--container-backend docker, or --backend docker).
func init() { environment.RegisterBackend("docker", fromConfig) }

// fromConfig connects to the engine of cfg.DockerHost, with DataDir/docker
// as the work directory and DefaultDiskBytes as the workspace cap of
// containers whose spec sets none.
func fromConfig(cfg environment.Config) (environment.Backend, func(), error) {
	b, err := New(Config{
		Host:          cfg.DockerHost,
		DefaultImage:  cfg.DefaultImage,
		OperatorArgs:  cfg.OperatorArgs,
		WorkDir:       filepath.Join(cfg.DataDir, "docker"),
		Runtime:       cfg.GvisorRuntime,
		DefaultLimits: environment.Limits{DiskBytes: cfg.DefaultDiskBytes},
		Log:           cfg.Log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("docker backend: %w", err)
	}
	// Workspace volumes nobody used for the retention period go, like
	// the process backend's workspaces.
	ctx, stop := context.WithCancel(context.Background())
	go b.RunRetention(ctx, cfg.WorkspaceRetention, min(max(cfg.WorkspaceRetention/10, time.Second), time.Hour))
	return b, func() { stop(); _ = b.Close() }, nil
}
